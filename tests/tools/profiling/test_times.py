"""exportTimes parsing and the summary, checked against numpy on the raw JSON records."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from stgcnd.errors import UserError
from stgcnd_tools.profiling.times import load_times, summarize_times, write_times_outputs
from tests.tools.profiling.conftest import DATA

STATS = {"median": 50, "p90": 90, "p95": 95, "p99": 99}


def _expect(values: list[float]) -> dict[str, float]:
    arr = np.array(values)
    out = {"min": arr.min(), "max": arr.max(), "mean": arr.mean(), "std": arr.std()}
    out.update({k: np.percentile(arr, q) for k, q in STATS.items()})
    return out


def _check(summary_part: dict[str, float], values: list[float]) -> None:
    for key, expected in _expect(values).items():
        assert summary_part[key] == pytest.approx(expected, rel=1e-12, abs=1e-12), key


def test_real_rtx3090_times_match_numpy(shared):
    path = shared / "trex_tf-resnet50_rtx3090_fp32.exportTimes.json"
    raw = json.loads(path.read_text())
    summary = summarize_times(load_times(path), batch=32)
    assert summary["iterations"] == len(raw) == 263
    _check(summary["gpu_compute_ms"], [r["computeMs"] for r in raw])
    _check(summary["latency_ms"], [r["latencyMs"] for r in raw])
    _check(summary["enqueue_ms"], [r["endEnqMs"] - r["startEnqMs"] for r in raw])
    # Walltime: earliest start of any stage to latest end of any stage (in this file an H2D
    # start can precede its enqueue start).
    starts = [r[k] for r in raw for k in ("startEnqMs", "startH2dMs", "startComputeMs")]
    ends = [r[k] for r in raw for k in ("endEnqMs", "endComputeMs", "endD2hMs")]
    walltime_s = (max(ends) - min(starts)) / 1000
    assert summary["throughput"]["qps"] == pytest.approx(len(raw) / walltime_s)
    assert summary["throughput"]["windows_per_s"] == pytest.approx(32 * len(raw) / walltime_s)
    mean_compute = np.mean([r["computeMs"] for r in raw])
    assert summary["throughput"]["gpu_bound_qps"] == pytest.approx(1000 / mean_compute)


def test_real_times_median_agrees_with_trtexec_log_summary(shared):
    # TREx parsed the same run's log: its GPU compute median and min are single records, so
    # they must be the values numpy finds for an odd record count.
    meta = json.loads((shared / "trex_tf-resnet50_rtx3090_fp32.profile.metadata.json").read_text())
    log_min, _, _, log_median, _ = meta["performance_summary"]["GPU Compute Time"]
    summary = summarize_times(load_times(shared / "trex_tf-resnet50_rtx3090_fp32.exportTimes.json"))
    assert summary["gpu_compute_ms"]["median"] == pytest.approx(log_median)
    assert summary["gpu_compute_ms"]["min"] == pytest.approx(log_min)


def test_handmade_times_with_copies_and_jitter():
    raw = json.loads((DATA / "handmade_trt10_times.json").read_text())
    records = load_times(DATA / "handmade_trt10_times.json")
    summary = summarize_times(records, batch=2)
    _check(summary["h2d_ms"], [r["h2dMs"] for r in raw])
    _check(summary["d2h_ms"], [r["d2hMs"] for r in raw])
    compute = np.array([r["computeMs"] for r in raw])
    jitter = summary["jitter_ms"]["gpu_compute"]
    assert jitter["p99_minus_median"] == pytest.approx(
        np.percentile(compute, 99) - np.percentile(compute, 50))
    assert jitter["max_minus_min"] == pytest.approx(compute.max() - compute.min())
    assert jitter["mean_abs_successive_diff"] == pytest.approx(np.abs(np.diff(compute)).mean())
    assert summary["latency_ms"]["mean"] > summary["gpu_compute_ms"]["mean"]


def test_trt7_key_names():
    raw = json.loads((DATA / "handmade_trt7_times.json").read_text())
    records = load_times(DATA / "handmade_trt7_times.json")
    assert [r.h2d_ms for r in records] == [r["inMs"] for r in raw]
    assert [r.d2h_ms for r in records] == [r["outMs"] for r in raw]
    assert all(r.enqueue_ms is None for r in records)
    summary = summarize_times(records)
    assert "enqueue_ms" not in summary
    _check(summary["latency_ms"], [r["latencyMs"] for r in raw])


def test_outputs_written_and_consistent(tmp_path):
    raw = json.loads((DATA / "handmade_trt10_times.json").read_text())
    paths = write_times_outputs(load_times(DATA / "handmade_trt10_times.json"), tmp_path, 3)
    assert sorted(p.name for p in paths.values()) == [
        "latency_percentiles.csv", "latency_series.csv", "summary.csv", "summary.json"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["batch"] == 3
    with (tmp_path / "latency_series.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["gpu_compute_ms"]) for r in rows] == [r["computeMs"] for r in raw]
    assert float(rows[0]["start_ms"]) == 0.0
    with (tmp_path / "latency_percentiles.csv").open() as fh:
        pct = {float(r["percentile"]): float(r["latency_ms"]) for r in csv.DictReader(fh)}
    assert pct[99.0] == pytest.approx(np.percentile([r["latencyMs"] for r in raw], 99))
    assert pct[100.0] == pytest.approx(max(r["latencyMs"] for r in raw))
    with (tmp_path / "summary.csv").open() as fh:
        by_metric = {r["metric"]: r for r in csv.DictReader(fh)}
    assert float(by_metric["gpu_compute_ms"]["p95"]) == pytest.approx(
        np.percentile([r["computeMs"] for r in raw], 95))


def test_not_a_times_file_is_a_user_error(tmp_path):
    bad = tmp_path / "times.json"
    bad.write_text('{"Layers": []}')
    with pytest.raises(UserError, match="exportTimes"):
        load_times(bad)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    with pytest.raises(UserError, match="no records"):
        summarize_times(load_times(empty))
