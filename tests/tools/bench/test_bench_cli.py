"""`stgcnd bench` end to end on the CPU (a short window so that it takes seconds), and
`stgcnd doctor --json`: what the commands do and say, called in process (`stgcnd_main`)."""

from __future__ import annotations

import csv
import json
import sys

import numpy as np
import pytest


def test_bench_cpu_rows(tmp_path, checkpoint_path, stgcnd_main):
    out_json, out_csv = tmp_path / "bench.json", tmp_path / "bench.csv"
    proc = stgcnd_main(
        "bench", "--checkpoint", str(checkpoint_path), "--frames", "16", "--persons", "1", "2",
        "--backends", "torch", "--iterations", "3", "--warmup", "1", "--sessions", "1", "2",
        "--json", str(out_json), "--csv", str(out_csv))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out_json.read_text())
    # Per persons count: the baseline, then torch fp32 with 1 and 2 sessions.
    assert [(r["backend"], r["persons"], r["sessions"]) for r in rows] == [
        ("torch-eager", 1, 1), ("torch", 1, 1), ("torch", 1, 2),
        ("torch-eager", 2, 1), ("torch", 2, 1), ("torch", 2, 2)]
    for r in rows:
        assert r["precision"] == "fp32" and r["batch"] == 1 and r["frames"] == 16
        assert r["min_ms"] <= r["median_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["iterations"] == 3 * r["sessions"]
        assert r["max_abs_diff"] <= 1e-4 and r["top1_agreement"] == 1.0
    for base, row in ((rows[0], rows[1]), (rows[3], rows[4])):
        assert "eager" in base["backend"] and base["speedup"] == 1.0
        assert np.isclose(row["speedup"], base["median_ms"] / row["median_ms"])
        assert np.isclose(row["windows_per_s"], 1e3 / row["mean_ms"])
        assert np.isclose(row["speedup_min"], base["min_ms"] / row["min_ms"])
        if row["gflops"] is not None:  # torch >= 2.1 counts the FLOPs
            assert np.isclose(row["gflops"] / row["windows_per_s"],
                              base["gflops"] / base["windows_per_s"])
            assert row["peak_share"] is None  # a CPU's peak is not known without the flag
    with open(out_csv) as f:
        assert [r["backend"] for r in csv.DictReader(f)][:2] == ["torch-eager", "torch"]
    # The table on stdout, progress on stderr.
    assert "speedup (min)" in proc.stdout and "torch-eager" in proc.stdout
    assert "load average" in proc.stdout
    assert "[M=2 B=1]" in proc.stderr


def test_bench_rejects_bad_flags(stgcnd_main):
    proc = stgcnd_main("bench", "--batch", "0")
    assert proc.returncode == 2 and "error" in proc.stderr and "Traceback" not in proc.stderr


def test_doctor_json(stgcnd_main):
    proc = stgcnd_main("doctor", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["python"].startswith(sys.version.split()[0])
    assert set(report["backends"]) == {"tensorrt", "torch", "onnxruntime", "noop"}
    torch = pytest.importorskip("torch")
    assert report["versions"]["torch"] == torch.__version__
    assert report["cuda"]["available"] == torch.cuda.is_available()
