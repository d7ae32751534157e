"""The named loads' goals judge a report (stgcnd loadtest --scenario)."""

from __future__ import annotations

from stgcnd.tools.loadtest.plan import LoadPlan
from stgcnd.tools.loadtest.scenarios import SCENARIOS, format_verdicts, verdicts


def report(**over: object) -> dict:
    r: dict = {"round_trip_ms": {"p99": 4.0}, "overhead_ms": {"p99": 0.9},
               "lost_replies": 0, "error_replies": 0, "replies": 500, "predictions": 500,
               "daemon_cpu": {"us_per_request": 120.0}, "join": None}
    r.update(over)
    return r


def test_every_scenario_is_a_valid_load_plan():
    for s in SCENARIOS.values():
        LoadPlan(endpoint="ipc:///tmp/x", **s.load)


def test_one_camera_is_judged_against_the_floor():
    s = SCENARIOS["one-camera"]
    met = verdicts(s, report(), floor_us=500.0)         # 0.9 ms <= 0.5 + 0.5
    assert [r["met"] for r in met] == [True, True]
    missed = verdicts(s, report(), floor_us=300.0)      # 0.9 ms > 0.3 + 0.5
    assert missed[0]["met"] is False
    assert "MISSED" in format_verdicts(missed)


def test_lost_replies_and_missing_predictions_miss_their_goals():
    assert verdicts(SCENARIOS["paced-64"], report(lost_replies=1), None)[1]["met"] is False
    push = verdicts(SCENARIOS["push"], report(predictions=499), None)
    assert push[0]["met"] is False and push[0]["value"] == 1


def test_joins_without_a_join_section_are_not_applicable():
    rows = verdicts(SCENARIOS["joins"], report(), None)
    assert rows[0]["met"] is None and "n/a" in format_verdicts(rows)
    joined = report(join={"first_reply_ms": {"max": 1200.0}, "never_replied": 0,
                          "joining_cameras": {"error_replies": 0}})
    assert [r["met"] for r in verdicts(SCENARIOS["joins"], joined, None)] == [False, True, True]
