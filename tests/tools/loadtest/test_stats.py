"""Percentiles over merged raw records, checked against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stgcnd_tools.stats import count_codes, distribution, merge, rate, select


def closest_ranks(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, written out (the rule the report uses)."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def test_distribution_of_one_to_ten():
    d = distribution(list(range(10, 0, -1)))  # order must not matter
    assert d["count"] == 10 and d["max"] == 10.0 and d["mean"] == 5.5
    # Ranks 0..9: p50 sits halfway between 5 and 6, p90 at 9 + 0.1, p99 at 9 + 0.91.
    assert d["p50"] == pytest.approx(5.5)
    assert d["p90"] == pytest.approx(9.1)
    assert d["p99"] == pytest.approx(9.91)


def test_distribution_matches_the_written_out_rule_on_random_data():
    rng = np.random.default_rng(3)
    values = list(rng.lognormal(0.0, 1.0, size=997))
    d = distribution(values)
    for q in (50, 90, 99):
        assert d[f"p{q}"] == pytest.approx(closest_ranks(values, q), rel=1e-12)


def test_non_finite_values_are_left_out_and_empty_gives_nones():
    d = distribution([1.0, np.nan, 3.0, np.inf])
    assert d["count"] == 2 and d["p50"] == 2.0 and d["max"] == 3.0
    empty = distribution([np.nan])
    assert empty == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None,
                     "max": None}


def test_merged_percentiles_are_not_percentiles_of_percentiles():
    fast = {"rtt": np.full(99, 1.0)}
    slow = {"rtt": np.array([100.0])}
    merged = merge([fast, slow])
    assert merged["rtt"].size == 100
    # One slow request in a hundred: the merged median stays 1 ms; the mean of the two
    # cameras' medians would say 50.5 ms.
    assert distribution(merged["rtt"])["p50"] == 1.0
    assert distribution(merged["rtt"])["p99"] == pytest.approx(closest_ranks(
        [1.0] * 99 + [100.0], 99))
    assert merge([]) == {}


def test_select_codes_and_rate():
    cols = {"t": np.array([0.5, 1.5, 2.5]), "code": np.array(["", "busy", ""], dtype=object)}
    picked = select(cols, cols["t"] > 1.0)
    assert picked["t"].tolist() == [1.5, 2.5] and picked["code"].tolist() == ["busy", ""]
    codes = np.array(["", "busy", "expired", "busy", ""], dtype=object)
    assert count_codes(codes) == {"busy": 2, "expired": 1}
    assert rate(30, 3.0) == 10.0 and rate(5, 0.0) == 0.0
