"""The report from hand-made camera records: what is counted, where, and the table."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from stgcnd_tools.loadtest.camera import COLUMNS, CameraResult, ModelTarget, empty_columns
from stgcnd_tools.loadtest.daemon_cpu import CpuSample, per_request, sample
from stgcnd_tools.loadtest.plan import LoadPlan
from stgcnd_tools.loadtest.report import build_report, format_table, has_failures

NAN = float("nan")
PLAN = LoadPlan("ipc:///tmp/x.sock", cameras=1, rate_hz=10.0, warmup=1.0, duration=2.0,
                join=1, join_at=0.5, join_window=1.0, run_id="t")
TARGET = ModelTarget("m", (3, 20, 33, 1))


def columns(rows: list[tuple]) -> dict[str, np.ndarray]:
    """The rows below, with an empty `message` (the daemon's; the report reads codes only)."""
    cols = empty_columns()
    for j, name in enumerate(COLUMNS):
        cols[name] = np.array([(*r, "")[j] for r in rows], dtype=cols[name].dtype)
    return cols


def cameras() -> list[CameraResult]:
    #        t    lag  rtt   send  pred   queue compute total code
    running = CameraResult("a", joining=False, start=0.0, dropped=2, columns=columns([
        (0.5, 0.0, 100., 100., True, 0.1, 0.5, 0.8, ""),     # warm-up: not counted
        (1.0, 0.5, 2.0, 1.5, True, 0.1, 0.5, 0.8, ""),
        (1.6, 0.2, 0.3, 0.1, False, NAN, NAN, NAN, "busy"),   # inside the join window
        (2.6, 0.1, 5000., 5000., False, NAN, NAN, NAN, "timeout"),
        (2.9, 1.5, 4.0, 3.0, True, 0.2, 1.0, 1.5, ""),        # a late send
        (3.0, 0.0, 2.0, 2.0, True, 0.1, 0.5, 0.8, ""),        # past the end: not counted
    ]))
    joiner = CameraResult("b", joining=True, start=1.5, first_reply_ms=10.0,
                          first_prediction_ms=10.0, columns=columns([
                              (1.5, 0.0, 10.0, 10.0, True, 5.0, 2.0, 8.0, ""),
                              (1.6, 0.3, 3.0, 2.5, True, 0.1, 0.5, 0.9, ""),
                          ]))
    return [running, joiner]


def samples(first: float | None, last: float | None, requests: tuple[int, int] = (100, 105),
            proc: tuple[float, float] | None = None) -> dict:
    """Two CPU samples; `requests`: the daemon's own counter in each stats reply; `proc`:
    /proc's readings of its pid beside them."""
    return {"first": CpuSample(first, "stats" if first is not None else None, 7,
                               requests=requests[0], proc_cpu_s=proc[0] if proc else None),
            "last": CpuSample(last, "stats" if last is not None else None, 7,
                              requests=requests[1], proc_cpu_s=proc[1] if proc else None),
            "first_at_s": 1.0, "last_at_s": 3.0, "load_cpu_s": 0.8}


def test_counts_rates_and_latency_over_the_measured_interval():
    r = build_report(PLAN, TARGET, cameras(), samples(10.0, 10.5))
    assert (r["requests"], r["replies"], r["lost_replies"], r["predictions"]) == (6, 5, 1, 4)
    assert r["errors"] == {"busy": 1} and r["error_replies"] == 1
    assert r["windows_per_s"] == 2.0 and r["requests_per_s"] == 2.5
    rt = r["round_trip_ms"]  # successful replies only: 2, 4, 10, 3
    assert rt["count"] == 4 and rt["p50"] == 3.5 and rt["max"] == 10.0
    assert r["round_trip_from_send_ms"]["p50"] == 2.75  # 1.5, 3, 10, 2.5
    # Overhead = round trip from the send minus compute: 1.0, 2.0, 8.0, 2.0.
    assert r["overhead_ms"]["p50"] == 2.0 and r["overhead_ms"]["max"] == 8.0
    assert r["server_ms"]["queue"]["max"] == 5.0 and r["server_ms"]["compute"]["count"] == 4
    assert r["open_loop"]["late_sends"] == 1 and r["open_loop"]["dropped_sends"] == 2
    # 0.5 s of daemon CPU over the 5 requests the daemon read (this load's 5 replies).
    assert r["daemon_cpu"]["us_per_request"] == pytest.approx(1e5)
    assert r["daemon_cpu"]["requests"] == 5 and r["daemon_cpu"]["other_clients"] is False
    assert r["daemon_cpu"]["source"] == "stats" and r["daemon_cpu"]["sampled_s"] == [0.0, 2.0]
    # The load processes' CPU over all 8 requests they sent, warm-up and tail included.
    assert r["load_cpu"]["requests"] == 8 and r["load_cpu"]["us_per_request"] == pytest.approx(1e5)
    assert has_failures(r)
    json.dumps(r, allow_nan=False)  # what --json writes must be strict JSON


def test_join_is_reported_apart():
    j = build_report(PLAN, TARGET, cameras(), samples(1.0, 2.0))["join"]
    assert j["cameras"] == 1 and j["at_s"] == 0.5 and j["window_s"] == 1.0
    assert j["first_reply_ms"]["per_camera"] == {"b": 10.0} and j["never_replied"] == 0
    # Only the running camera's requests due in [1.5, 2.5) s: the busy one, not the lost one.
    assert j["running_cameras"]["errors"] == {"busy": 1}
    assert j["running_cameras"]["lost_replies"] == 0
    assert j["joining_cameras"]["replies"] == 2 and j["joining_cameras"]["errors"] == {}


def test_per_camera_rows_and_table():
    r = build_report(PLAN, TARGET, cameras(), samples(None, None))
    rows = {row["camera"]: row for row in r["cameras"]}
    assert rows["a"]["requests"] == 4 and rows["a"]["dropped_sends"] == 2
    assert rows["b"]["start_s"] == 1.5 and rows["b"]["first_reply_ms"] == 10.0
    assert r["daemon_cpu"]["us_per_request"] is None
    table = format_table(r)
    for text in ("windows/s 2.0", "busy 1, lost 1", "1 late sends", "2 dropped",
                 "join: 1 camera(s) at 0.5 s", "daemon CPU per request: n/a"):
        assert text in table, text


def test_a_clean_run_has_no_failures():
    good = CameraResult("c", joining=False, start=0.0, columns=columns([
        (1.2, 0.0, 1.0, 1.0, True, 0.1, 0.2, 0.3, "")]))
    plan = LoadPlan("ipc:///tmp/x.sock", rate_hz=None, warmup=1.0, duration=1.0)
    r = build_report(plan, TARGET, [good], samples(1.0, 1.001, requests=(7, 8)))
    assert not has_failures(r) and r["open_loop"] is None and r["join"] is None
    assert r["daemon_cpu"]["us_per_request"] == pytest.approx(1000.0)


def test_cpu_sources_in_order():
    mine = os.getpid()
    from_stats = sample({"process_cpu_s": 12.5, "pid": 1, "requests": 40},
                        "tcp://10.0.0.9:5555")
    assert (from_stats.cpu_s, from_stats.source, from_stats.requests) == (12.5, "stats", 40)
    assert from_stats.proc_cpu_s is None  # another machine's pid 1: not read here
    # On this machine /proc is read beside the daemon's own figure, as a check.
    beside = sample({"process_cpu_s": 12.5, "pid": mine, "requests": 40}, "ipc:///x")
    assert beside.source == "stats" and beside.proc_cpu_s is not None and beside.proc_cpu_s > 0
    # No process_cpu_s: psutil on the pid, when the daemon is on this machine.
    local = sample({"pid": mine}, "ipc:///run/stgcnd/stgcnd.sock")
    assert local.source == "psutil" and local.cpu_s is not None and local.cpu_s > 0
    remote = sample({"pid": mine}, "tcp://10.0.0.9:5555")
    assert remote.cpu_s is None and "not on this machine" in remote.note
    served = sample({}, "tcp://10.0.0.9:5555", served_pid=mine)  # a daemon we started
    assert served.source == "psutil"
    assert sample({}, "ipc:///x").cpu_s is None
    gone = per_request(CpuSample(1.0, "stats", 1, requests=1),
                       CpuSample(None, None, 1, "stats: timeout"), 10)
    assert gone["us_per_request"] is None and gone["note"] == "stats: timeout"
    mixed = per_request(CpuSample(1.0, "stats", 1), CpuSample(2.0, "psutil", 1), 10)
    assert mixed["us_per_request"] is None


def test_cpu_per_request_is_over_every_request_the_daemon_read():
    """Other clients sent the daemon 20 requests beside this load's 5: the figure is the
    daemon's CPU over all it read (as /proc says), not charged to this load's 5 replies
    alone (issue #32)."""
    r = build_report(PLAN, TARGET, cameras(), samples(10.0, 10.5, requests=(100, 125),
                                                      proc=(20.0, 20.5)))
    cpu = r["daemon_cpu"]
    assert cpu["us_per_request"] == pytest.approx(2e4) and cpu["requests"] == 25
    assert cpu["proc_us_per_request"] == pytest.approx(2e4)
    assert cpu["load_replies"] == 5 and cpu["other_clients"] is True
    table = format_table(r)
    assert "daemon CPU per request: 20000.0 us over 25 requests it read (stats; /proc: " \
           "20000.0 us)" in table
    assert "other clients shared the daemon" in table
    no_count = build_report(PLAN, TARGET, cameras(), samples(10.0, 10.5, requests=(None, None)))
    assert no_count["daemon_cpu"]["us_per_request"] is None
    assert "no requests counter" in no_count["daemon_cpu"]["note"]
