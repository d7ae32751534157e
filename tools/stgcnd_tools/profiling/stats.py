"""The one set of summary statistics used everywhere in the profiling toolkit.

Percentiles use numpy's default definition (linear interpolation between the two closest ranks),
so a p99 here can differ slightly from trtexec's own log summary, which picks a single record.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

# Order of the keys in every summary dict, table and CSV.
STAT_KEYS = ("min", "mean", "median", "p90", "p95", "p99", "max", "std")
PERCENTILES = {"median": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


def describe(values: Iterable[float]) -> dict[str, float]:
    """min/mean/median/p90/p95/p99/max/std of `values`; an empty input gives an empty dict."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return {}
    out = {"min": float(arr.min()), "mean": float(arr.mean())}
    for key, q in PERCENTILES.items():
        out[key] = float(np.percentile(arr, q))
    out["max"] = float(arr.max())
    out["std"] = float(arr.std())
    return {key: out[key] for key in STAT_KEYS}
