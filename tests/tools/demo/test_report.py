"""The demo's rate verdict and its start-up progress lines, on numbers and log lines."""

from __future__ import annotations

import json
import threading
from collections import Counter

from stgcnd_tools.demo.camera_sim import format_table, row
from stgcnd_tools.demo.progress import LogFollower, describe
from stgcnd_tools.demo.report import (
    Load,
    Outcome,
    events_line,
    explain_rate,
    prediction_verdict,
)
from stgcnd_tools.loadtest.camera import Camera, ModelTarget, RunClock
from stgcnd_tools.loadtest.plan import CameraPlan, LoadPlan


def test_saturated_cpu_is_named_with_its_numbers():
    lines = explain_rate(Load(cameras=4, fps=25, windows_per_s=4.0, compute_ms=450.0,
                              achieved_hz=20.0, latency_ms=470.0))
    text = "\n".join(lines)
    assert "below their 25 fps (-20%)" in text
    assert "CPU is saturated" in text and "4.0 windows/s x 450 ms" in text
    assert "1800 ms of compute per second" in text


def test_slow_without_saturation_says_so():
    text = "\n".join(explain_rate(Load(4, 25, 4.0, 100.0, 20.0, 180.0)))
    assert "saturated" not in text and "400 ms per second" in text and "180 ms" in text


def test_kept_rate_is_one_line():
    assert explain_rate(Load(2, 25, 2.0, 50.0, 24.6, 60.0)) == [
        "cameras kept their rate: 24.6 Hz of 25 fps (within 10 %)"]


def _outcome(without: tuple[str, ...] = ("cam1", "cam2"), expired: int = 0,
             timed_out: int = 0, busy: int = 0, other: int = 0) -> Outcome:
    return Outcome(cameras=2, predictions=0 if len(without) == 2 else 9,
                   without_predictions=without, expired=expired,
                   timed_out=timed_out, busy=busy, other_errors=other)


def test_every_camera_with_predictions_is_no_verdict():
    assert prediction_verdict(_outcome(()), 5.0, 25, 20.0) is None


def test_a_run_shorter_than_a_window_is_told_to_run_longer():
    # 150 frames at 25 fps take 6 s to fill: a 5 s run can have no prediction at all.
    assert prediction_verdict(_outcome(), 5.0, 25, 5.0) == (
        "no camera got a prediction: a window is 150 frames, 6.0 s at 25 fps, and the "
        "cameras ran 5 s; run longer (--duration)")
    # Full windows (window mode) need no filling.
    assert "run longer" not in str(prediction_verdict(_outcome(expired=9), 5.0, 25, 5.0,
                                                      push=False))


def test_no_prediction_in_time_says_why_and_what_to_change():
    """#32.2: every prediction expired (or got no reply in time): a failure, with the
    numbers and the options that change it."""
    line = prediction_verdict(_outcome(expired=30, timed_out=2), 0.005, 25, 20.0)
    assert line == (
        "no camera got a prediction: 30 request(s) were answered expired and 2 got no reply "
        "within the 0.005 s timeout, so the daemon could not answer in time (a saturated CPU, "
        "or too short a timeout); pass a longer --timeout, or ask less of it: fewer --cameras "
        "or a larger --stride")


def test_some_cameras_without_predictions_are_named():
    line = prediction_verdict(_outcome(("cam2",), busy=12), 5.0, 25, 20.0)
    assert line is not None and line.startswith("1 of 2 cameras got no prediction (cam2): 12 ")
    assert "fewer --cameras" in line


def test_events_are_told_as_they_happened():
    """#32.2: 'each camera's event lasts until the shutdown' was printed with 0 events."""
    assert events_line(0, Counter(), predictions=0) == \
        "events: none (no prediction came back, so none could start)"
    assert events_line(0, Counter(), predictions=3).startswith("events: none started")
    assert events_line(2, Counter(shutdown=2), predictions=40) == (
        "events: 2 started, 2 ended at the shutdown, which ends every open event (the demo "
        "model sees its second class in every window)")
    assert events_line(3, Counter({"below-exit": 2, "shutdown": 1}), predictions=40) == \
        "events: 3 started, 3 ended (2 below-exit, 1 shutdown)"


def test_table_shows_dashes_until_there_is_data():
    camera = Camera(LoadPlan("ipc:///tmp/nobody.sock", cameras=1),
                    CameraPlan("cam1", 0, 0.0, False), ModelTarget("demo", (3, 150, 18, 2)),
                    RunClock(), threading.Event())
    table = format_table([row(camera, 0.0)])  # no request recorded yet
    assert "nan" not in table
    assert table.splitlines()[-1].split()[3:7] == ["-", "-", "-", "-"]


def test_follower_reads_complete_lines_only(tmp_path):
    path = tmp_path / "log"
    follower = LogFollower(path)
    assert follower.events() == []  # not written yet
    event = {"event": "onnx_export_needed", "reason": "missing", "level": "info"}
    line = json.dumps(event)
    path.write_text("not json\n" + line[:10])
    assert follower.events() == []
    with open(path, "a") as f:
        f.write(line[10:] + "\n")
    (got,) = follower.events()
    assert describe(got) == "exporting the model to ONNX (missing) ..."
    assert describe({"event": "request"}) is None
    assert describe({"event": "model_load_failed", "level": "error", "error": "boom"}) == \
        "error: model_load_failed boom"


def test_overload_answers_do_not_fail_the_demo_other_errors_do():
    from stgcnd_tools.commands.demo import _outcome

    rows = [{"camera": "cam1", "predictions": 5, "errors": 3, "expired": 2, "timed_out": 1,
             "error_causes": {"the daemon answered expired: deadline passed": 2,
                              "no reply within 5 s (the daemon is overloaded)": 1}},
            {"camera": "cam2", "predictions": 5, "errors": 1, "expired": 0, "timed_out": 0,
             "error_causes": {"the daemon answered busy: queue full": 1}},
            {"camera": "cam3", "predictions": 5, "errors": 0, "expired": 0, "timed_out": 0,
             "error_causes": {}}]
    outcome = _outcome(rows)
    assert (outcome.overload, outcome.failures) == (3, 1)
