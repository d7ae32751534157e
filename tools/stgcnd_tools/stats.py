"""The one set of summary statistics of the tools (bench, loadtest, trtexec, the demo).

Percentiles: numpy's default rule, linear interpolation between the two closest ranks, over the
finite values; a p99 here can differ slightly from trtexec's own log, which picks one record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

# Keys of `stgcnd loadtest`'s distributions; the trtexec summary's and the bench rows' below.
LOADTEST_KEYS = ("count", "mean", "p50", "p90", "p99", "max")
TRTEXEC_KEYS = ("min", "mean", "median", "p90", "p95", "p99", "max", "std")
BENCH_KEYS = ("mean", "median", "p90", "p95", "p99", "min", "max")


def distribution(values: Any, keys: Sequence[str] = LOADTEST_KEYS) -> dict[str, Any]:
    """`keys` (count, mean, min, max, std, median, pNN) of the finite values; each None but
    count when there are none."""
    a = np.asarray(values, dtype=np.float64).ravel()
    a = a[np.isfinite(a)]
    out: dict[str, Any] = {}
    for key in keys:
        if key == "count":
            out[key] = int(a.size)
        elif a.size == 0:
            out[key] = None
        elif key in ("mean", "min", "max", "std"):
            out[key] = float(getattr(a, key)())
        else:
            out[key] = float(np.percentile(a, 50.0 if key == "median" else float(key[1:])))
    return out


def latency_stats(times_ms: Sequence[float]) -> dict[str, float]:
    """A bench row's mean_ms, median_ms, p90_ms, ... of per-call latencies."""
    if len(times_ms) == 0:
        raise ValueError("no timings")
    return {f"{k}_ms": v for k, v in distribution(times_ms, BENCH_KEYS).items()}


def merge(records: Iterable[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate per-camera record columns into one set of columns."""
    records = list(records)
    if not records:
        return {}
    return {key: np.concatenate([r[key] for r in records]) for key in records[0]}


def select(columns: Mapping[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {key: col[mask] for key, col in columns.items()}


def count_codes(codes: np.ndarray) -> dict[str, int]:
    """Error code -> count; the empty code (success) is not an error."""
    return dict(sorted(Counter(str(c) for c in codes if c).items()))


def number(value: Any) -> float | None:
    """`value` if it is an int or a float (a JSON number; not a bool), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0
