"""Latency statistics of a benchmark row."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

STAT_KEYS = ("mean_ms", "median_ms", "p90_ms", "p95_ms", "p99_ms", "min_ms", "max_ms")


def latency_stats(times_ms: Sequence[float]) -> dict[str, float]:
    """mean/median/p90/p95/p99/min/max of per-call latencies (linear-interpolated percentiles)."""
    if len(times_ms) == 0:
        raise ValueError("no timings")
    a = np.asarray(times_ms, dtype=np.float64)
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    return {"mean_ms": float(a.mean()), "median_ms": float(p50), "p90_ms": float(p90),
            "p95_ms": float(p95), "p99_ms": float(p99), "min_ms": float(a.min()),
            "max_ms": float(a.max())}
