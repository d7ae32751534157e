"""Reports from real and stand-in run folders: files exist, numbers match the inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stgcnd_tools.profiling.report import write_report
from stgcnd_tools.profiling.runner import RunOptions, run_trtexec
from tests.tools.profiling.conftest import FAKE_TRTEXEC, REPO, make_run_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
R50 = "trex_tf-resnet50_rtx3090_fp32"
R18 = "fuzzylabs_resnet18_fp16_rtx3060_trt10"


@pytest.fixture
def r50_run(shared, tmp_path) -> Path:
    return make_run_dir(tmp_path / "r50", sorted(shared.glob(f"{R50}.*")))


@pytest.fixture
def r18_run(shared, tmp_path) -> Path:
    return make_run_dir(tmp_path / "r18", sorted(shared.glob(f"{R18}.*")))


def test_single_run_report(shared, r50_run, tmp_path):
    out = tmp_path / "report"
    result = write_report([r50_run], out, batch=32, top_k=10)
    for name in ("report.md", "report.json", "summary.json", "summary.csv",
                 "latency_series.csv", "latency_percentiles.csv"):
        assert (out / name).is_file(), name
    report = json.loads((out / "report.json").read_text())
    assert report["plots_skipped"] is None
    assert set(report["plots"]) == {"latency_histogram.png", "latency_series.png",
                                    "percentile_curve.png", "top_layers.png",
                                    "layer_type_share.png"}
    for name in report["plots"]:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    assert set(result.files) >= {out / "report.md", out / "latency_histogram.png"}

    run = report["runs"][0]
    times = json.loads((shared / f"{R50}.exportTimes.json").read_text())
    compute = [t["computeMs"] for t in times]
    assert run["timing"]["gpu_compute_ms"]["p99"] == pytest.approx(np.percentile(compute, 99))
    assert run["timing"]["gpu_compute_ms"]["median"] == pytest.approx(np.median(compute))
    assert run["timing"]["batch"] == 32

    layers = [r for r in json.loads((shared / f"{R50}.exportProfile.json").read_text())
              if "name" in r]
    slowest = max(layers, key=lambda r: r["averageMs"])
    assert run["top_layers"][0]["name"] == slowest["name"]
    assert run["top_layers"][0]["type"] == "CaskConvolution"
    assert len(run["top_layers"]) == 10
    shares = {r["type"]: r for r in run["layer_type_share"]}
    assert sum(r["share_percent"] for r in shares.values()) == pytest.approx(100.0)
    graph = json.loads((shared / f"{R50}.exportLayerInfo.json").read_text())
    conv_names = {la["Name"] for la in graph["Layers"] if la["LayerType"] == "CaskConvolution"}
    assert shares["CaskConvolution"]["average_ms"] == pytest.approx(
        sum(r["averageMs"] for r in layers if r["name"] in conv_names))
    assert shares["CaskConvolution"]["count"] == len(conv_names)
    assert run["device"] == "NVIDIA GeForce RTX 3090"

    md = (out / "report.md").read_text()
    assert f"{np.percentile(compute, 99):.4g}" in md
    assert "![latency histogram](latency_histogram.png)" in md
    assert slowest["name"] in md


def test_comparison_ratios(shared, r18_run, r50_run, tmp_path):
    out = tmp_path / "cmp"
    report = write_report([r18_run, r50_run], out).report
    metrics = {m["metric"]: m for m in report["comparison"]["metrics"]}
    # r18 has no times file: its numbers come from the TREx-parsed log summary.
    r18_meta = json.loads((shared / f"{R18}.profile.metadata.json").read_text())
    r18_median = r18_meta["performance_summary"]["GPU Compute Time"][3]
    r50_median = float(np.median([t["computeMs"] for t in json.loads(
        (shared / f"{R50}.exportTimes.json").read_text())]))
    median = metrics["gpu_compute_median_ms"]
    assert median["values"] == pytest.approx([r18_median, r50_median])
    assert median["ratios"] == pytest.approx([1.0, r50_median / r18_median])

    def summed(stem: str) -> float:
        rows = json.loads((shared / f"{stem}.exportProfile.json").read_text())
        return sum(r["averageMs"] for r in rows if "name" in r)

    total = metrics["layer_time_total_ms"]
    assert total["ratios"][1] == pytest.approx(summed(R50) / summed(R18))
    assert metrics["layers"]["values"] == [26, 103]
    assert "comparison.png" in report["plots"]
    assert (out / "comparison.png").read_bytes()[:8] == PNG_MAGIC
    md = (out / "report.md").read_text()
    assert "## Comparison" in md and "r50 / r18" in md
    assert f"{r50_median / r18_median:.3g}×" in md


def test_report_of_a_stand_in_run(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TRTEXEC_ARGV", str(tmp_path / "argv.json"))
    engine = tmp_path / "stgcn.engine"
    engine.write_bytes(b"\x01" * (3 * 2**20))
    run_dir = tmp_path / "runs" / "stgcn"
    run_trtexec(RunOptions(engine=engine), run_dir, trtexec=FAKE_TRTEXEC)
    report = write_report([run_dir], batch=5).report  # written into the run folder
    run = report["runs"][0]
    assert run["tensorrt_version"] == "10.3.0"
    assert run["device"] == "Orin"
    assert run["headline"]["engine_size_mib"] == pytest.approx(3.0)
    assert run["profile"]["repaired_invalid_json"] is True
    assert run["top_layers"][0]["name"] == "/gcn/Conv + /gcn/Relu"
    assert run["top_layers"][0]["type"] == "CaskConvolution"
    assert run["layer_info"]["schema"] == "11.x"
    assert run["timing"]["throughput"]["windows_per_s"] == pytest.approx(
        5 * run["timing"]["throughput"]["qps"])
    for name in ("report.md", "report.json", "build.metadata.json", "profile.metadata.json",
                 *report["plots"]):
        assert (run_dir / name).is_file()
    build = json.loads((run_dir / "build.metadata.json").read_text())
    assert build["build"]["created_engine_size_mib"] == 6.5213
    md = (run_dir / "report.md").read_text()
    assert '/tcn/Einsum "A·x"' in md
    assert "GPU compute time is unstable" in md


def test_report_without_matplotlib(r50_run, tmp_path):
    """matplotlib made unimportable in a real interpreter: report still written, says why."""
    out = tmp_path / "noplots"
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from stgcnd_tools.profiling.report import write_report\n"
            f"write_report([{str(r50_run)!r}], {str(out)!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)
    report = json.loads((out / "report.json").read_text())
    assert report["plots"] == []
    assert "matplotlib is not installed" in report["plots_skipped"]
    assert not list(out.glob("*.png"))
    assert "Plots skipped: matplotlib is not installed" in (out / "report.md").read_text()
