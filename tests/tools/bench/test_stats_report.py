"""Bench statistics and output formats, against values worked out by hand."""

from __future__ import annotations

import csv
import json

import pytest

from stgcnd_tools.bench.report import COLUMNS, format_table, write_csv, write_json
from stgcnd_tools.stats import latency_stats


def test_latency_stats_by_hand():
    times = [float(i) for i in range(1, 101)]      # 1..100 ms
    s = latency_stats(times)
    # Linear interpolation between order statistics: rank p/100 * (n - 1) from 0.
    assert s["median_ms"] == pytest.approx(50.5)
    assert s["p90_ms"] == pytest.approx(90.1)      # 0.9 * 99 = 89.1 -> 90 + 0.1
    assert s["p95_ms"] == pytest.approx(95.05)
    assert s["p99_ms"] == pytest.approx(99.01)
    assert s["mean_ms"] == pytest.approx(50.5)
    assert (s["min_ms"], s["max_ms"]) == (1.0, 100.0)
    with pytest.raises(ValueError):
        latency_stats([])


def _row(backend, median, speedup):
    return {"backend": backend, "precision": "fp32", "device": "cpu", "persons": 1,
            "frames": 150, "batch": 1, "sessions": 1, "mean_ms": median, "median_ms": median,
            "p90_ms": median, "p95_ms": median, "p99_ms": median, "min_ms": median,
            "max_ms": median, "windows_per_s": 1000 / median, "speedup": speedup,
            "max_abs_diff": 0.0, "iterations": 3}


def test_json_csv_and_table(tmp_path):
    rows = [_row("torch-eager", 200.0, 1.0), _row("torch", 80.0, 2.5)]
    write_json(tmp_path / "r.json", rows)
    write_csv(tmp_path / "r.csv", rows)
    data = json.loads((tmp_path / "r.json").read_text())
    assert [r["backend"] for r in data] == ["torch-eager", "torch"]
    assert data[1]["median_ms"] == 80.0 and set(data[0]) == set(COLUMNS)
    with open(tmp_path / "r.csv") as f:
        table = list(csv.DictReader(f))
    assert table[1]["speedup"] == "2.5" and table[0]["note"] == ""
    text = format_table(rows)
    assert "2.50x" in text and "torch-eager" in text.splitlines()[2]
