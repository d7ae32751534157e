"""Named loads with their goals: `stgcnd loadtest --scenario NAME` (docs/performance.md).

Every goal is an upper bound on one figure of the report (met, MISSED, or n/a). Goals about
what no daemon can beat are judged against the bare ZeroMQ floor measured in the same run;
the limits are issue #10's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

# typing's Dict, Callable and Optional: these aliases are evaluated at run time, where 3.8
# has no dict[...], no subscriptable collections.abc.Callable and no `X | None`.
Report = Dict[str, Any]
Figure = Callable[[Report], Optional[float]]


@dataclass(frozen=True)
class Goal:
    what: str                    # "round trip p99 <= 10 ms"
    figure: Figure               # the figure judged; None: the run has none
    limit: Figure                # the most it may be; None: not known in this run
    unit: str = "ms"


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    load: dict[str, Any]                        # LoadPlan fields
    goals: tuple[Goal, ...] = field(default=())
    floor_s: float = 0.0   # seconds of the bare ZeroMQ floor at this load (0: no goal needs it)


def _floor(r: Report) -> dict[str, Any]:
    return r.get("floor") or {}


def _floor_p99_plus_half_ms(r: Report) -> float | None:
    p99 = (_floor(r).get("round_trip_ms") or {}).get("p99")
    return None if p99 is None else p99 + 0.5


def _twice_floor_cpu(r: Report) -> float | None:
    echo = _floor(r).get("echo_cpu_us_per_request")
    return None if echo is None else 2.0 * echo


def _lost(r: Report) -> float | None:
    # Nothing sent, nothing lost: that proves nothing, so no figure.
    return float(r["lost_replies"] + r["error_replies"]) if r["requests"] else None


def _join_errors(r: Report) -> float | None:
    j = r["join"]
    return float(j.get("never_replied", 0) + (j.get("joining_cameras") or {}).get(
        "error_replies", 0)) if j else None


def _missing_predictions(r: Report) -> float | None:
    """Push mode at stride 1 with every window full: one prediction per frame, exactly."""
    if not r["replies"]:
        return None
    return float(abs(r["replies"] - r["predictions"]) + r["error_replies"])


def _cpu_us(r: Report) -> float | None:
    return (r["daemon_cpu"] or {}).get("us_per_request")


def _at_most(value: float) -> Figure:
    return lambda _r: value


NONE_LOST = Goal("errors and lost replies = 0", _lost, _at_most(0.0), "")
SCENARIOS = {s.name: s for s in (
    Scenario("one-camera", "one camera at 25 Hz: the daemon's own overhead",
             {"processes": 1, "cameras": 1, "rate_hz": 25.0, "duration": 20.0, "warmup": 2.0},
             (Goal("overhead p99 <= floor p99 + 0.5 ms", lambda r: r["overhead_ms"]["p99"],
                   _floor_p99_plus_half_ms), NONE_LOST),
             floor_s=10.0),
    Scenario("paced-64", "64 cameras at 25 Hz (1,600 windows/s)",
             {"processes": 8, "cameras": 8, "rate_hz": 25.0, "duration": 15.0, "warmup": 3.0},
             (Goal("round trip p99 <= 10 ms", lambda r: r["round_trip_ms"]["p99"],
                   _at_most(10.0)), NONE_LOST,
              Goal("daemon CPU per request <= 2x floor", _cpu_us, _twice_floor_cpu, "us")),
             floor_s=10.0),
    Scenario("saturation", "128 cameras, closed loop: the most windows per second",
             {"processes": 8, "cameras": 16, "rate_hz": None, "duration": 15.0,
              "warmup": 3.0}, (NONE_LOST,)),
    Scenario("joins", "4 cameras at 25 Hz, then 32 join at once",
             {"processes": 1, "cameras": 4, "rate_hz": 25.0, "duration": 10.0, "warmup": 1.0,
              "join": 32, "join_at": 4.0},
             (Goal("joining cameras' first reply <= 1 s",
                   lambda r: r["join"]["first_reply_ms"]["max"] if r["join"] else None,
                   _at_most(1000.0)),
              Goal("joining cameras' errors = 0", _join_errors, _at_most(0.0), ""),
              NONE_LOST)),
    Scenario("push", "4 cameras sending single frames at 25 Hz (push mode, stride 1)",
             {"processes": 1, "cameras": 4, "rate_hz": 25.0, "duration": 10.0, "warmup": 7.0,
              "mode": "push"},
             (Goal("one prediction per frame, exactly", _missing_predictions,
                   _at_most(0.0), ""),)),
)}


def describe_load(load: dict[str, Any]) -> str:
    """A scenario's load in words, for messages: "8 processes x 8 cameras at 25 Hz, ..."."""
    loop = "closed loop" if load.get("rate_hz") is None else f"at {load['rate_hz']:g} Hz"
    join = f", {load['join']} joining" if load.get("join") else ""
    return (f"{load['processes']} process(es) x {load['cameras']} camera(s) {loop}, "
            f"{load.get('mode', 'window')} mode{join}, {load['duration']:g} s after "
            f"{load['warmup']:g} s of warm-up")


def _why_not_judged(goal: Goal, report: Report, value: float | None) -> str:
    if value is None:
        if goal.figure is _cpu_us:
            return "no CPU figure: " + ((report["daemon_cpu"] or {}).get("note") or "unknown")
        return "no figure in this run (nothing answered, or nothing to count)"
    return "no floor: " + (_floor(report).get("note") or "it was not measured")


def verdicts(scenario: Scenario, report: Report) -> list[dict[str, Any]]:
    out = []
    for goal in scenario.goals:
        value, limit = goal.figure(report), goal.limit(report)
        met: bool | None = None
        note = ""
        if value is not None and limit is not None:
            met = bool(value <= limit)
        else:
            note = _why_not_judged(goal, report, value)
        out.append({"goal": goal.what, "value": value, "limit": limit, "unit": goal.unit,
                    "met": met, "note": note})
    return out


def _amount(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{value:.3g} {unit}".strip()


def format_verdicts(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        mark = {True: "met", False: "MISSED", None: "n/a"}[row["met"]]
        if row["met"] is None:
            lines.append(f"  goal: {row['goal']:<42} n/a ({row['note']})")
            continue
        judged = (f"{_amount(row['value'], row['unit'])} (at most "
                  f"{_amount(row['limit'], row['unit'])})")
        lines.append(f"  goal: {row['goal']:<42} {judged:>28}   {mark}")
    met = sum(r["met"] is True for r in rows)
    missed = sum(r["met"] is False for r in rows)
    lines.append(f"  {met} of {len(rows)} goals met, {missed} missed, "
                 f"{len(rows) - met - missed} not judged (n/a)")
    return "\n".join(lines)


def missed(rows: list[dict[str, Any]]) -> bool:
    return any(r["met"] is False for r in rows)
