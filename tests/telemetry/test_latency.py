"""Latency aggregation against numpy on random samples, within the documented 1% bound."""

from __future__ import annotations

import numpy as np
import pytest

from stgcnd.telemetry.latency import MAX_MS, MIN_MS, LatencyAggregator, LogHistogram

BOUND = 0.01 + 1e-9


def assert_close(estimate: float, exact: float) -> None:
    assert abs(estimate - exact) <= BOUND * abs(exact), (estimate, exact)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_percentiles_match_numpy_within_relative_error(seed):
    rng = np.random.default_rng(seed)
    samples = np.concatenate([rng.lognormal(np.log(12.0), 0.4, 4000),  # ~12 ms typical
                              rng.uniform(80, 400, 60)])  # a slow tail
    agg = LatencyAggregator()
    for value in samples:
        agg.record("cam3", "stgcn-fp16", float(value))
    (rec,) = agg.drain(interval_s=10.0)
    assert rec["camera"] == "cam3" and rec["model"] == "stgcn-fp16"
    assert rec["count"] == rec["ok"] == len(samples)
    assert rec["rate_hz"] == pytest.approx(len(samples) / 10.0)
    for p in (50, 90, 95, 99):
        assert_close(rec[f"p{p}_ms"], float(np.percentile(samples, p, method="lower")))
    assert rec["max_ms"] == pytest.approx(samples.max(), abs=1e-3)


def test_outcomes_are_counted_and_only_ok_replies_are_timed():
    agg = LatencyAggregator()
    ok = [5.0, 6.0, 7.0, 8.0, 9.0]
    for v in ok:
        agg.record("a", "m", v)
    for _ in range(3):
        agg.record("a", "m", 0.1, outcome="busy")
    agg.record("a", "m", 900.0, outcome="error")
    agg.record("a", "m", 2000.0, outcome="expired")
    (rec,) = agg.drain(2.0)
    assert (rec["count"], rec["ok"], rec["errors"], rec["busy"], rec["expired"]) == (10, 5, 1, 3, 1)
    assert rec["rate_hz"] == 5.0
    assert rec["max_ms"] == 9.0
    assert_close(rec["p50_ms"], 7.0)


def test_only_errors_gives_counts_without_percentiles():
    agg = LatencyAggregator()
    agg.record("a", "m", 1.0, outcome="error")
    (rec,) = agg.drain(1.0)
    assert rec["count"] == 1 and rec["errors"] == 1
    assert rec["p50_ms"] is None and rec["max_ms"] is None


def test_drain_starts_a_new_interval_and_keys_are_separate():
    agg = LatencyAggregator()
    agg.record("cam1", "m", 3.0)
    agg.record("cam2", "m", 30.0)
    agg.record("cam1", "other", 300.0)
    recs = agg.drain(1.0)
    assert [(r["camera"], r["model"], r["count"]) for r in recs] == [
        ("cam1", "m", 1), ("cam1", "other", 1), ("cam2", "m", 1)]
    assert agg.drain(1.0) == []


def test_stage_timings_get_their_own_percentiles():
    rng = np.random.default_rng(5)
    queue = rng.exponential(2.0, 3000) + 0.05
    compute = rng.normal(9.0, 0.5, 3000).clip(1.0)
    agg = LatencyAggregator()
    for q, c in zip(queue, compute):
        agg.record("cam", "m", float(q + c), timings={"queue_ms": float(q), "compute_ms": float(c)})
    (rec,) = agg.drain(1.0)
    for name, values in (("queue", queue), ("compute", compute)):
        for p in (50, 99):
            assert_close(rec[f"{name}_p{p}_ms"], float(np.percentile(values, p, method="lower")))


def test_only_the_named_stages_of_a_replys_timings_are_kept():
    agg = LatencyAggregator()
    timings = {"queue_ms": 1.0, "compute_ms": 2.0, "batch": 8, "total_ms": 3.5}
    agg.record("cam", "m", 3.5, timings=timings, stages=("queue_ms", "compute_ms", "h2d_ms"))
    agg.record(7, "m", 1.0)  # a non-string camera id is kept under its string
    agg.record("7", "m", 2.0)
    recs = {r["camera"]: r for r in agg.drain(1.0)}
    assert sorted(k for k in recs["cam"] if k.endswith("p50_ms")) == [
        "compute_p50_ms", "p50_ms", "queue_p50_ms"]   # no batch, no absent h2d
    assert recs["cam"]["queue_p50_ms"] == 1.0 and recs["cam"]["compute_p50_ms"] == 2.0
    assert recs["7"]["count"] == 2


def test_replies_recorded_with_other_stages_keep_their_own():
    agg = LatencyAggregator()
    agg.record("cam", "m", 3.0, timings={"queue_ms": 1.0, "compute_ms": 2.0},
               stages=("queue_ms",))
    agg.record("cam", "m", 5.0, timings={"compute_ms": 4.0})  # every key of its timings
    (rec,) = agg.drain(1.0)
    assert rec["count"] == rec["ok"] == 2
    assert rec["queue_p99_ms"] == 1.0 and rec["compute_p50_ms"] == rec["compute_p99_ms"] == 4.0


def test_out_of_range_and_nan_values():
    hist = LogHistogram(0.01)
    for v in (1e-9, 5e7, float("nan"), float("inf"), 2.0):
        hist.add(v)
    assert hist.count == 4                 # NaN is dropped, inf clamps like any huge value
    assert hist.min == 1e-9 and hist.max == float("inf")
    lo, hi = hist.quantiles((0, 100))
    # Reported at the clamps (1 us, ~2.8 h), as the module says; the extremes stay exact.
    assert abs(lo - MIN_MS) <= 0.01 * MIN_MS and abs(hi - MAX_MS) <= 0.01 * MAX_MS


def test_memory_is_bounded_by_the_range_not_the_sample_count():
    hist = LogHistogram(0.01)
    limit = hist.bucket_limit()
    assert limit < 1500
    rng = np.random.default_rng(9)
    values = np.exp(rng.uniform(np.log(1e-6), np.log(1e9), 200_000))  # beyond both clamps
    for v in values:
        hist.add(float(v))
    assert hist.count == 200_000
    assert hist.bucket_count <= limit
    more = LogHistogram(0.01)
    for v in values[:2000]:
        more.add(float(v))
    # 100x the samples, same bucket ceiling: growth is in counts, not buckets.
    assert hist.bucket_count <= limit and more.bucket_count <= limit


def test_unknown_outcome_is_rejected():
    with pytest.raises(ValueError, match="outcome"):
        LatencyAggregator().record("a", "m", 1.0, outcome="timeout")
