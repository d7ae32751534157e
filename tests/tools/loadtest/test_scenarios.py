"""The named loads' goals judge a report (stgcnd loadtest --scenario): each can be missed, and
one without its figure or its limit is n/a, never met (issue #32)."""

from __future__ import annotations

from stgcnd_tools.loadtest.plan import LoadPlan
from stgcnd_tools.loadtest.scenarios import SCENARIOS, format_verdicts, missed, verdicts


def floor(p99_ms: float = 1.5, echo_cpu_us: float | None = 80.0) -> dict:
    return {"transport": "ipc", "processes": 1, "cameras": 1, "rate_hz": 25.0, "seconds": 10.0,
            "warmup_s": 1.0, "round_trip_ms": {"p99": p99_ms},
            "echo_cpu_us_per_request": echo_cpu_us, "echo_requests": 9000}


def report(**over: object) -> dict:
    r: dict = {"round_trip_ms": {"p99": 4.0}, "overhead_ms": {"p99": 1.9},
               "requests": 500, "lost_replies": 0, "error_replies": 0, "replies": 500,
               "predictions": 500, "daemon_cpu": {"us_per_request": 120.0, "note": ""},
               "join": None, "floor": floor()}
    r.update(over)
    return r


def test_every_scenario_is_a_valid_load_plan():
    for s in SCENARIOS.values():
        LoadPlan(endpoint="ipc:///tmp/x", **s.load)


def test_one_camera_is_judged_against_the_floor_measured_in_the_run():
    s = SCENARIOS["one-camera"]
    met = verdicts(s, report(floor=floor(p99_ms=1.5)))       # 1.9 ms <= 1.5 + 0.5
    assert [r["met"] for r in met] == [True, True] and met[0]["limit"] == 2.0
    # The GPU run: overhead p99 2.04 ms against a floor p99 of 1.51 ms.
    missed_rows = verdicts(s, report(overhead_ms={"p99": 2.04}, floor=floor(p99_ms=1.51)))
    assert missed_rows[0]["met"] is False and missed(missed_rows)
    assert "2.04 ms (at most 2.01 ms)   MISSED" in format_verdicts(missed_rows)


def test_a_goal_without_its_floor_is_not_applicable_never_met():
    rows = verdicts(SCENARIOS["one-camera"], report(floor=None))
    assert rows[0]["met"] is None and "no floor" in rows[0]["note"]
    remote = {"note": "the daemon (tcp://10.0.0.9:5555) is on another machine"}
    rows = verdicts(SCENARIOS["one-camera"], report(floor=remote))
    text = format_verdicts(rows)
    assert "n/a (no floor: the daemon (tcp://10.0.0.9:5555) is on another machine)" in text
    assert "met" not in text.split("\n")[0] and not missed(rows)
    assert "1 of 2 goals met, 0 missed, 1 not judged (n/a)" in text


def test_paced_cpu_goal_can_be_missed_against_the_echo_floor():
    s = SCENARIOS["paced-64"]
    cpu_row = verdicts(s, report(daemon_cpu={"us_per_request": 150.0}))[2]  # 2 x 80 us
    assert cpu_row["met"] is True and cpu_row["limit"] == 160.0
    cpu_row = verdicts(s, report(daemon_cpu={"us_per_request": 170.0}))[2]
    assert cpu_row["met"] is False
    cpu_row = verdicts(s, report(daemon_cpu={"us_per_request": 504.0}))[2]
    assert cpu_row["met"] is False and cpu_row["value"] == 504.0
    no_cpu = verdicts(s, report(daemon_cpu={"us_per_request": None,
                                            "note": "stats: timeout"}))[2]
    assert no_cpu["met"] is None and no_cpu["note"] == "no CPU figure: stats: timeout"
    too_few = verdicts(s, report(floor=floor(echo_cpu_us=None)))[2]
    assert too_few["met"] is None and "no floor" in too_few["note"]


def test_lost_replies_and_missing_predictions_miss_their_goals():
    assert verdicts(SCENARIOS["paced-64"], report(lost_replies=1))[1]["met"] is False
    push = verdicts(SCENARIOS["push"], report(predictions=499))
    assert push[0]["met"] is False and push[0]["value"] == 1


def test_nothing_sent_proves_nothing():
    silent = report(requests=0, replies=0, predictions=0, round_trip_ms={"p99": None})
    rows = verdicts(SCENARIOS["paced-64"], silent)
    assert [r["met"] for r in rows[:2]] == [None, None]
    assert verdicts(SCENARIOS["push"], silent)[0]["met"] is None


def test_joins_without_a_join_section_are_not_applicable():
    rows = verdicts(SCENARIOS["joins"], report())
    assert rows[0]["met"] is None and "n/a" in format_verdicts(rows)
    joined = report(join={"first_reply_ms": {"max": 1200.0}, "never_replied": 0,
                          "joining_cameras": {"error_replies": 0}})
    assert [r["met"] for r in verdicts(SCENARIOS["joins"], joined)] == [False, True, True]
