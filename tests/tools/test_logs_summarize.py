"""`stgcnd logs summarize` and `stgcnd tegrastats parse` on logs written by the real logger."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stgcnd.log import configure_logging, get_logger
from stgcnd.telemetry.latency import LatencyAggregator
from stgcnd.telemetry.sampler import SystemSampler
from stgcnd_tools.logs.summarize import scan, summarize
from tests.telemetry.conftest import DATA, make_tegrastats  # noqa: F401 - a fixture

FOREIGN = ["Traceback (most recent call last):", "some other program says hi",
           '{"no_event_field": 1}', "[1, 2, 3]"]


def piped(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    """`stgcnd ARGS` reading a real pipe; the other calls run in process (stgcnd_main)."""
    return subprocess.run([sys.executable, "-m", "stgcnd", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def daemon_log(tmp_path, make_tegrastats) -> Path:  # noqa: F811 - the fixture
    """A log as the daemon writes it: latency events from the aggregator, system events from
    the sampler reading a tegrastats child, plus lines from other programs."""
    path = tmp_path / "stgcnd.log"
    with path.open("w") as stream:
        configure_logging("info", "json", stream=stream)
        log = get_logger("stgcnd.daemon")
        stream.write(FOREIGN[0] + "\n")
        script = make_tegrastats(DATA / "thor_jp7_r39_2.txt")
        sampler = SystemSampler(0.05, lambda s: None, tegrastats_path=str(script))
        sampler.start()
        agg = LatencyAggregator()
        try:
            for interval in range(3):
                for i in range(20):
                    agg.record("cam1", "fp16", 10.0 + i, timings={"queue_ms": 1.0})
                for i in range(10):
                    agg.record("cam3", "fp16", 40.0 + i)
                agg.record("cam3", "fp16", 0.2, outcome="busy")
                if interval == 2:
                    agg.record("cam3", "fp16", 1.0, outcome="error")
                    agg.record("cam3", "fp16", 1.0, outcome="expired")
                for rec in agg.drain(interval_s=1.0):
                    log.info("latency", **rec)
                deadline = time.monotonic() + 20
                while sampler.sample_once()["tegrastats_age_s"] is None:
                    assert time.monotonic() < deadline, "no tegrastats line arrived"
                    time.sleep(0.01)
                log.info("system", **sampler.sample_once())
                stream.write(FOREIGN[1 + interval] + "\n")
        finally:
            sampler.stop(5.0)
        log.info("shutdown_complete")
    configure_logging("info", "json")
    return path


def test_daemon_log_summary_counts(daemon_log, stgcnd_main):
    result = stgcnd_main("logs", "summarize", str(daemon_log), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["lines"]["skipped_not_ours"] == len(FOREIGN)
    assert summary["events"] == {"latency": 6, "system": 3, "shutdown_complete": 1}
    streams = {(s["camera"], s["model"]): s for s in summary["streams"]}
    cam1, cam3 = streams[("cam1", "fp16")], streams[("cam3", "fp16")]
    assert (cam1["requests"], cam1["ok"], cam1["errors"], cam1["intervals"]) == (60, 60, 0, 3)
    assert (cam3["requests"], cam3["ok"], cam3["busy"], cam3["errors"], cam3["expired"]) == \
        (35, 30, 3, 1, 1)
    assert cam3["busy_rate"] == pytest.approx(3 / 35, abs=1e-4)
    # Every interval of cam3 held 40..49 ms: p50 by the lower rank is 44 (within 1%).
    assert cam3["latency"]["p50_ms"] == pytest.approx(44.0, rel=0.01)
    assert cam3["latency"]["max_ms"] == 49.0
    assert cam3["latency"]["method"].startswith("approximate")
    # The system fields joined to each interval come from the Thor lines.
    row = cam3["per_interval"][0]
    assert row["gpu_freq_mhz"] == 314 and row["gpu_temp_c"] == 35.906
    assert summary["system"]["samples"] == 3
    assert summary["system"]["gpu_freq_mhz"] == {"min": 314, "mean": 314.0, "max": 314}
    assert summary["system"]["power_total_mw"]["max"] in (4925 + 8710 + 6767, 4925 + 7953 + 6667)


def test_camera_filter_text_output_and_plot(daemon_log, tmp_path):
    out = tmp_path / "cam3.png"
    result = piped("logs", "summarize", "--camera", "cam3", "--plot", str(out),
                   stdin=daemon_log.read_text())
    assert result.returncode == 0, result.stderr
    assert "camera cam3" in result.stdout and "camera cam1" not in result.stdout
    assert "requests 35 (ok 30, errors 1" in result.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_since_until_filter(daemon_log, stgcnd_main):
    future = stgcnd_main("logs", "summarize", str(daemon_log), "--json", "--since",
                         "2999-01-01T00:00:00Z")
    assert json.loads(future.stdout)["streams"] == []
    recent = stgcnd_main("logs", "summarize", str(daemon_log), "--json", "--since", "1h")
    assert len(json.loads(recent.stdout)["streams"]) == 2
    bad = stgcnd_main("logs", "summarize", str(daemon_log), "--since", "yesterday-ish")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--since" in bad.stderr


def test_missing_file_is_a_one_line_user_error(tmp_path, stgcnd_main):
    result = stgcnd_main("logs", "summarize", str(tmp_path / "missing.log"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "cannot read" in result.stderr


def test_request_events_give_exact_percentiles():
    rng = np.random.default_rng(3)
    totals = rng.gamma(3.0, 5.0, 500)
    lines = [json.dumps({"event": "request", "timestamp": f"2025-06-01T14:02:{i % 60:02d}Z",
                         "camera": "cam3", "model": "m", "total_ms": float(v), "outcome": "ok"})
             for i, v in enumerate(totals)]
    lines.append(json.dumps({"event": "request", "timestamp": "2025-06-01T14:02:59Z",
                             "camera": "cam3", "model": "m", "outcome": "busy"}))
    (stream,) = summarize(scan(lines))["streams"]
    assert stream["requests"] == 501 and stream["busy"] == 1
    for p in (50, 90, 99):
        assert stream["latency"][f"p{p}_ms"] == float(np.percentile(totals, p, method="lower"))
    assert stream["latency"]["method"].startswith("exact")


def test_interval_combination_is_count_weighted():
    # Two intervals: 90 requests around 10 ms, 10 requests around 100 ms.
    lines = [json.dumps({"event": "latency", "timestamp": "2025-06-01T14:00:00Z", "camera": "c",
                         "model": "m", "count": 90, "ok": 90, "p50_ms": 10.0, "p99_ms": 12.0,
                         "max_ms": 13.0, "errors": 0, "busy": 0, "expired": 0}),
             json.dumps({"event": "latency", "timestamp": "2025-06-01T14:00:10Z", "camera": "c",
                         "model": "m", "count": 10, "ok": 10, "p50_ms": 100.0, "p99_ms": 150.0,
                         "max_ms": 160.0, "errors": 0, "busy": 0, "expired": 0}),
             "journal: not ours"]
    summary = summarize(scan(lines))
    lat = summary["streams"][0]["latency"]
    assert lat["p50_ms"] == 10.0  # 90 of 100 requests sit in the 10 ms interval
    assert lat["p99_ms"] == 150.0 and lat["worst_interval_p99_ms"] == 150.0
    assert lat["max_ms"] == 160.0
    assert summary["lines"]["skipped_not_ours"] == 1


def test_syslog_prefixed_lines_are_read():
    line = ('Jun 01 14:02:03 orin stgcnd[812]: {"event": "latency", "timestamp": '
            '"2025-06-01T14:02:03Z", "camera": "cam3", "model": "m", "count": 5, "errors": 1}')
    summary = summarize(scan([line]))
    assert summary["streams"][0]["requests"] == 5 and summary["streams"][0]["errors"] == 1


def test_tegrastats_parse_command(tmp_path, stgcnd_main):
    source = DATA / "agx_orin_jp6_r36_4_4.txt"
    result = stgcnd_main("tegrastats", "parse", str(source))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 3 and all(r["ok"] for r in rows)
    assert [r["power_mw"]["VIN_SYS_5V0"] for r in rows] == [4707, 4607, 4707]
    from_pipe = piped("tegrastats", "parse", "-", stdin="not tegrastats\n" + source.read_text())
    rows = [json.loads(line) for line in from_pipe.stdout.splitlines()]
    assert [r["ok"] for r in rows] == [False, True, True, True]
    missing = stgcnd_main("tegrastats", "parse", str(tmp_path / "none.log"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_plot_without_a_gpu_shows_cpu_and_no_empty_series():
    pytest.importorskip("matplotlib")
    from datetime import datetime, timedelta, timezone

    from stgcnd_tools.logs.plot import STREAM_COLOURS, figure
    from stgcnd_tools.logs.summarize import LogScan

    t0 = datetime(2026, 11, 25, 13, 0, tzinfo=timezone.utc)
    log = LogScan()
    for i in range(5):
        t = t0 + timedelta(seconds=10 * i)
        log.latency += [{"_t": t, "camera": f"cam{c}", "model": "demo", "p50_ms": 1.0 + c,
                         "p99_ms": 3.0 + c} for c in range(3)]
        log.system.append({"_t": t, "cpu_pct": 40.0 + i, "gpu_load_pct": None})
    fig = figure(log)
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert "CPU %" in labels and not any("GPU" in label for label in labels)
    assert "cam0 / demo p99" in labels and len(fig.axes) == 2   # one panel and its twin
    colours = {line.get_color() for line in fig.axes[0].get_lines()}
    assert len(colours) == 3 and colours <= set(STREAM_COLOURS)
    assert fig.axes[0].xaxis.get_major_formatter()(0.5).count(":") == 2  # hours:minutes:seconds


def test_action_events_become_one_span_each_in_the_table_and_the_timeline():
    """The daemon's `action_event` lines (server/events.py): a start and its end paired by
    id, an event still open at the log's end shown as open; a panel of bars per camera."""
    pytest.importorskip("matplotlib")
    from stgcnd_tools.logs.plot import figure
    from stgcnd_tools.logs.summarize import render_text
    from stgcnd_tools.logs.timeline import events_figure

    t0 = 1764079200.0  # 2025-11-25 14:00:00 UTC

    def line(kind, camera, n, started, **more):
        return json.dumps({"event": "action_event", "timestamp": "2025-11-25T14:00:00Z",
                           "kind": kind, "id": f"{camera}/m/1/{n}", "camera": camera,
                           "model": "m", "class": "shoplifting", "started": t0 + started,
                           "peak": 0.9, **more})

    lines = [line("start", "cam1", 1, 10), line("start", "cam2", 1, 20),
             line("end", "cam1", 1, 10, ended=t0 + 18.5, peak=0.97, reason="below-exit"),
             json.dumps({"event": "latency", "timestamp": "2025-11-25T14:00:30Z",
                         "camera": "cam1", "model": "m", "p50_ms": 5.0, "p99_ms": 9.0,
                         "count": 10})]
    log = scan(lines)
    spans = summarize(log)["action_events"]
    assert [(s["camera"], s["reason"]) for s in spans] == [("cam1", "below-exit"),
                                                          ("cam2", None)]
    text = render_text(summarize(log))
    assert "cam1         14:00:10 - 14:00:18     8.5 s  shoplifting  peak 0.97  below-exit" \
        in text
    assert "cam2         14:00:20 - -             open  shoplifting  peak 0.90  still open" in text
    assert len(figure(log).axes) == 2     # latency and its twin: the events are apart
    timeline = events_figure(log).axes[0]
    assert [t.get_text() for t in timeline.get_yticklabels()] == ["cam1", "cam2"]
    assert len(timeline.collections) == 4       # each event: before and after its alarm
    assert len(scan(lines, camera="cam2").actions) == 1


def test_skeleton_quality_is_a_table_per_camera_weighted_by_frames():
    from stgcnd_tools.logs.summarize import render_text

    def line(camera, frames, no_person, usable, **more):
        return json.dumps({"event": "skeleton_quality", "timestamp": "2025-11-25T14:00:00Z",
                           "camera": camera, "frames": frames, "no_person": no_person,
                           "visibility": 0.9, "low_visibility": 0.1, "out_of_frame": 0.0,
                           "usable": usable, "silent": frames == 0, "blocked": False,
                           **more})

    lines = [line("cam1", 300, 0.0, 0.9), line("cam1", 100, 1.0, 0.0), line("cam1", 0, None,
                                                                         None),
             line("cam2", 0, None, None, silent=False, blocked=True)]
    (cam1, cam2) = summarize(scan(lines))["skeleton_quality"]
    assert cam1["no_person"] == 0.25 and cam1["worst_usable"] == 0.0    # 100 of 400 frames
    assert (cam1["intervals"], cam1["frames"], cam1["silent"]) == (3, 400, 1)
    assert cam2["blocked"] == 1 and cam2["no_person"] is None
    text = render_text(summarize(scan(lines)))
    assert "== skeleton quality" in text
    assert "cam1       400    0.25    0.90  0.10     0.00          0.00       1        0" \
        in text


def test_the_timeline_names_each_event_s_class_and_shows_feed_health():
    """#34: each event's class is named (#42: in the legend, by its colour); a camera's bad
    feed states (feed_health lines) are a strip under its row, from the change to the next
    (ok ends it), named in the legend."""
    pytest.importorskip("matplotlib")
    from stgcnd_tools.logs.timeline import events_figure

    t0 = 1764079200.0  # 2025-11-25 14:00:00 UTC

    def feed(camera, at, state, previous):
        return json.dumps({"event": "feed_health", "timestamp": "2025-11-25T14:00:00Z",
                           "kind": "feed", "camera": camera, "state": state,
                           "previous": previous, "at": t0 + at})

    lines = [json.dumps({"event": "action_event", "timestamp": "2025-11-25T14:00:00Z",
                         "kind": "start", "id": "cam1/m/1/1", "camera": "cam1", "model": "m",
                         "class": "shoplifting", "started": t0 + 10, "peak": 0.9}),
             feed("cam2", 5, "out-of-frame", "ok"), feed("cam2", 25, "ok", "out-of-frame"),
             feed("cam2", 30, "silent", "ok"),
             json.dumps({"event": "latency", "timestamp": "2025-11-25T14:00:40Z",
                         "camera": "cam1", "model": "m", "p50_ms": 5.0, "p99_ms": 9.0,
                         "count": 10})]
    log = scan(lines)
    assert len(log.feeds) == 3 and len(scan(lines, camera="cam1").feeds) == 0
    fig = events_figure(log)
    timeline = fig.axes[0]
    assert [t.get_text() for t in timeline.get_yticklabels()] == ["cam1", "cam2"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[0] == "shoplifting" and legend[-2:] == ["feed: out-of-frame", "feed: silent"]
    assert "open at the log's end" in legend
    assert len(timeline.collections) == 4      # cam1's event (2 parts), cam2's bad spells
