"""trtexec log parsing: real 8.2.5 logs, a hand-made 10.3 log, TREx metadata."""

from __future__ import annotations

import json
import re

import pytest

from stgcnd_tools.profiling.logparse import decode_banner_version, from_trex_metadata, load_log
from tests.tools.profiling.conftest import DATA

FP32_LOG = "nvidia_qat-ptq-notebook_mobilenetv2_fp32_trt8.2.5.trtexec.log"
INT8_LOG = "nvidia_qat-ptq-notebook_mobilenetv2_qat-int8_trt8.2.5.trtexec.log"


def _summary_line(text: str, metric: str) -> dict[str, float]:
    """Independent reading of one `Metric: min = .. ms, ...` line of the raw log."""
    line = next(li for li in text.splitlines() if f"] {metric}: min = " in li)
    pairs = re.findall(r"(min|max|mean|median|percentile\(99%\)) = ([\d.e+-]+) ms", line)
    return {("p99" if k.startswith("percentile") else k): float(v) for k, v in pairs}


@pytest.mark.parametrize("name", [FP32_LOG, INT8_LOG])
def test_real_trt82_logs(shared, name):
    text = (shared / name).read_text()
    parsed = load_log(shared / name)
    assert parsed.tensorrt_version == "8.2.5"
    assert parsed.status == "PASSED"
    assert parsed.command.startswith("trtexec --onnx=models/mobilenetv2_")
    perf = parsed.performance
    qps = float(re.search(r"Throughput: ([\d.]+) qps", text).group(1))
    assert perf["throughput_qps"] == qps
    for metric, slug in (("GPU Compute Time", "gpu_compute_time"), ("Latency", "latency"),
                         ("End-to-End Host Latency", "end_to_end_host_latency"),
                         ("Enqueue Time", "enqueue_time"), ("H2D Latency", "h2d_latency"),
                         ("D2H Latency", "d2h_latency")):
        assert perf["metrics_ms"][slug] == _summary_line(text, metric)
    walltime = float(re.search(r"Total Host Walltime: ([\d.]+) s", text).group(1))
    assert perf["total_host_walltime_s"] == walltime
    assert len(parsed.memory_changes) == text.count("[MemUsageChange]")
    built = float(re.search(r"Engine built in ([\d.]+) sec", text).group(1))
    assert parsed.build["engine_built_s"] == built
    assert parsed.build["loaded_engine_size_mib"] == float(
        re.search(r"Loaded engine size: (\d+) MiB", text).group(1))
    assert parsed.build["total_activation_memory_bytes"] == int(
        re.search(r"Total Activation Memory: (\d+)", text).group(1))
    device = parsed.sections["device_information"]
    assert device["Selected Device"] == "NVIDIA Graphics Device"
    assert device["Compute Capability"] == "8.0"
    assert parsed.sections["inference_options"]["CUDA Graph"] == "Disabled"
    assert len(parsed.warnings) == len(re.findall(r"^\[[^]]+\] \[W\]", text, re.M))


def test_int8_log_throughput_hints(shared):
    parsed = load_log(shared / INT8_LOG)
    assert parsed.sections["build_options"]["Precision"] == "FP32+INT8"
    assert any("bound by Enqueue Time" in h for h in parsed.hints)
    assert any("--noDataTransfers" in h for h in parsed.hints)


def test_trt10_log():
    parsed = load_log(DATA / "handmade_trt10.3_trtexec.log")
    assert parsed.tensorrt_version == "10.3.0"
    gpu = parsed.performance["metrics_ms"]["gpu_compute_time"]
    assert gpu == {"min": 1.1998, "max": 1.5842, "mean": 1.2219, "median": 1.2174,
                   "p90": 1.2311, "p95": 1.2420, "p99": 1.5590}
    assert parsed.build["created_engine_size_mib"] == 6.5213
    assert parsed.build["engine_deserialized_s"] == 0.0131
    assert parsed.build["engine_generation_s"] == 85.7
    assert parsed.build["total_weights_memory_bytes"] == 6291712
    assert parsed.build["trace_queries"] == 2391
    device = parsed.sections["device_information"]
    assert device["Selected Device"] == "Orin"
    assert device["Device 0"].startswith('"Orin" UUID: GPU-')
    assert parsed.sections["inference_options"]["Spin-wait"] == "Enabled"
    assert parsed.build_metadata()["build_options"]["Precision"] == "FP32+FP16"
    assert parsed.profile_metadata()["performance_summary"]["throughput_qps"] == 796.302


@pytest.mark.parametrize(("code", "version"), [("8205", "8.2.5"), ("8601", "8.6.1"),
                                               ("8400", "8.4.0"), ("100300", "10.3.0"),
                                               ("101300", "10.13.0"), ("110000", "11.0.0")])
def test_banner_versions(code, version):
    assert decode_banner_version(code) == version


@pytest.mark.parametrize("stem", ["trex_tf-resnet50_rtx3090_fp32",
                                  "fuzzylabs_resnet18_fp16_rtx3060_trt10"])
def test_trex_metadata(shared, stem):
    data = json.loads((shared / f"{stem}.profile.metadata.json").read_text())
    parsed = from_trex_metadata(data)
    raw = data["performance_summary"]["GPU Compute Time"]
    gpu = parsed.performance["metrics_ms"]["gpu_compute_time"]
    # Positional lists follow the log line: min, max, mean, median, [p90, p95,] p99.
    assert (gpu["min"], gpu["max"], gpu["mean"], gpu["median"], gpu["p99"]) == (
        raw[0], raw[1], raw[2], raw[3], raw[-1])
    assert parsed.performance["throughput_qps"] == data["performance_summary"]["Throughput"]
    assert parsed.sections["device_information"]["Selected Device"] == \
        data["device_information"]["Selected Device"]
