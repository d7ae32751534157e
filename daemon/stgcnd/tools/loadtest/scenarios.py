"""Named loads with their goals: `stgcnd loadtest --scenario NAME` (docs/performance.md).

Each scenario is a load plan and the figures it is judged by, so that a run on any machine
says in its last lines whether the daemon met them there. The goals are the project's
(issue #23): a single camera's overhead is judged against the bare ZeroMQ floor measured on
the same machine (`scripts/zmq_echo_floor.py`, passed as --floor-us), since no daemon can go
below it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Dict

Report = Dict[str, Any]  # typing.Dict: evaluated at run time, and 3.8 has no dict[...]


@dataclass(frozen=True)
class Goal:
    what: str                                   # "round trip p99 <= 10 ms"
    figure: Callable[[Report, float | None], float | None]
    ok: Callable[[float, float | None], bool]   # (figure, floor in us) -> met?
    unit: str = "ms"


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    load: dict[str, Any]                        # LoadPlan fields
    goals: tuple[Goal, ...] = field(default=())


def _p99(r: Report, _floor: float | None) -> float | None:
    return r["round_trip_ms"]["p99"]


def _overhead_p99(r: Report, _floor: float | None) -> float | None:
    return r["overhead_ms"]["p99"]


def _lost(r: Report, _floor: float | None) -> float:
    return float(r["lost_replies"] + r["error_replies"])


def _join_first(r: Report, _floor: float | None) -> float | None:
    return r["join"]["first_reply_ms"]["max"] if r["join"] else None


def _join_errors(r: Report, _floor: float | None) -> float:
    j = r["join"] or {}
    return float(j.get("never_replied", 0)
                 + (j.get("joining_cameras") or {}).get("error_replies", 0))


def _missing_predictions(r: Report, _floor: float | None) -> float:
    """Push mode at stride 1 with every window full: one prediction per frame, exactly."""
    return float(abs(r["replies"] - r["predictions"]) + r["error_replies"])


def _cpu_us(r: Report, _floor: float | None) -> float | None:
    return (r["daemon_cpu"] or {}).get("us_per_request")


NONE_LOST = Goal("errors and lost replies = 0", _lost, lambda v, _f: v == 0, "")
SCENARIOS = {s.name: s for s in (
    Scenario("one-camera", "one camera at 25 Hz: the daemon's own overhead",
             {"processes": 1, "cameras": 1, "rate_hz": 25.0, "duration": 20.0, "warmup": 2.0},
             (Goal("overhead p99 <= floor + 0.5 ms", _overhead_p99,
                   lambda v, floor: floor is None or v <= floor / 1e3 + 0.5), NONE_LOST)),
    Scenario("paced-64", "64 cameras at 25 Hz (1,600 windows/s)",
             {"processes": 8, "cameras": 8, "rate_hz": 25.0, "duration": 15.0, "warmup": 3.0},
             (Goal("round trip p99 <= 10 ms", _p99, lambda v, _f: v <= 10.0), NONE_LOST,
              Goal("daemon CPU per request (us)", _cpu_us, lambda v, _f: True, "us"))),
    Scenario("saturation", "128 cameras, closed loop: the most windows per second",
             {"processes": 8, "cameras": 16, "rate_hz": None, "duration": 15.0,
              "warmup": 3.0}, (NONE_LOST,)),
    Scenario("joins", "4 cameras at 25 Hz, then 32 join at once",
             {"processes": 1, "cameras": 4, "rate_hz": 25.0, "duration": 10.0, "warmup": 1.0,
              "join": 32, "join_at": 4.0},
             (Goal("joining cameras' first reply <= 1 s", _join_first,
                   lambda v, _f: v <= 1000.0),
              Goal("joining cameras' errors = 0", _join_errors, lambda v, _f: v == 0, ""),
              NONE_LOST)),
    Scenario("push", "4 cameras sending single frames at 25 Hz (push mode, stride 1)",
             {"processes": 1, "cameras": 4, "rate_hz": 25.0, "duration": 10.0, "warmup": 7.0,
              "mode": "push"},
             (Goal("one prediction per frame, exactly", _missing_predictions,
                   lambda v, _f: v == 0, ""),)),
)}


def verdicts(scenario: Scenario, report: Report, floor_us: float | None) -> list[dict[str, Any]]:
    out = []
    for goal in scenario.goals:
        value = goal.figure(report, floor_us)
        out.append({"goal": goal.what, "value": value, "unit": goal.unit,
                    "met": None if value is None else bool(goal.ok(value, floor_us))})
    return out


def format_verdicts(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        mark = {True: "met", False: "MISSED", None: "n/a"}[row["met"]]
        value = "-" if row["value"] is None else f"{row['value']:.3g} {row['unit']}".strip()
        lines.append(f"  goal: {row['goal']:<40} {value:>12}   {mark}")
    return "\n".join(lines)
