"""Percentiles and counts over merged raw records (never percentiles of percentiles)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

# Linear interpolation between closest ranks (numpy's default), the same rule as `stgcnd bench`.
PERCENTILES = (50, 90, 99)


def distribution(values: Any) -> dict[str, Any]:
    """count, mean, p50, p90, p99 and max of the finite values; None fields when there are none."""
    a = np.asarray(values, dtype=np.float64).ravel()
    a = a[np.isfinite(a)]
    if a.size == 0:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p = np.percentile(a, PERCENTILES)
    return {"count": int(a.size), "mean": float(a.mean()),
            **{f"p{q}": float(v) for q, v in zip(PERCENTILES, p)}, "max": float(a.max())}


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


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0
