"""The demo's rate verdict and its start-up progress lines, on numbers and log lines."""

from __future__ import annotations

import json

from stgcnd.tools.demo.camera_sim import CameraStats, format_table
from stgcnd.tools.demo.progress import LogFollower, describe
from stgcnd.tools.demo.report import Load, explain_rate


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


def test_a_run_shorter_than_a_window_is_not_called_slow():
    # 150 frames at 25 fps take 6 s to fill: a 5 s run can have no prediction at all.
    lines = explain_rate(Load(4, 25, 4.0, None, 22.3, None, duration_s=5.0))
    assert lines == ["no prediction yet: a window is 150 frames, 6.0 s at 25 fps, and the "
                     "cameras ran 5 s; run longer (--duration)"]
    assert "did not keep up" in "\n".join(explain_rate(Load(4, 25, 4.0, None, 2.0, None,
                                                            duration_s=20.0)))


def test_table_shows_dashes_until_there_is_data():
    table = format_table([CameraStats("cam1").row()])
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
    from stgcnd.commands.demo import _error_counts

    rows = [{"errors": 3, "error_causes": {"the daemon answered expired: deadline passed": 2,
                                           "no reply within 5 s (the daemon is overloaded)": 1}},
            {"errors": 1, "error_causes": {"the daemon answered busy: queue full": 1}},
            {"errors": 0, "error_causes": {}}]
    assert _error_counts(rows) == (3, 1)
