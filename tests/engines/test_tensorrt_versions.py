"""TensorRT version paths against the real Python bindings of 8.6, 10.3 and 11.4.

`../shared/tensorrt/stub-bindings.sh VERSION DIR` makes a release's real bindings importable
without TensorRT's libraries (it downloads the bindings wheel once). Each version runs in its
own interpreter. Expected values below were read by hand from ../shared/tensorrt/api-*.txt.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.conftest import REPO
from tests.trt_stubs import VERSIONS, stub_env

SHARED = REPO.parent / "shared" / "tensorrt"
BUILDER_SRC = REPO / "daemon" / "stgcnd" / "engines" / "builders" / "tensorrt.py"


PROBE = """
import json, sys
import tensorrt as trt
from stgcnd.engines.builders import tensorrt as b
from stgcnd.errors import UserError


def capabilities(trt):
    # Every version-dependent choice of the builder, from its pure functions of the module.
    plans = {}
    for precision, mode in (("fp32", "qdq"), ("fp16", "qdq"), ("int8", "qdq"),
                            ("int8", "calibrator")):
        name = precision if precision != "int8" else f"int8-{mode}"
        try:
            plan = b.precision_plan(trt, precision, mode)
            plans[name] = {"flags": list(plan.builder_flags),
                           "strongly_typed": plan.strongly_typed, "onnx": plan.onnx,
                           "calibrator": plan.calibrator,
                           "network_flags": b.network_flags(trt, plan.strongly_typed)}
        except UserError as exc:
            plans[name] = {"error": str(exc)}
    return {"version": str(trt.__version__), "build_api": b.build_api(trt),
            "workspace_api": b.workspace_api(trt), "opt_level": b.supports_opt_level(trt),
            "progress_monitor": b.supports_progress_monitor(trt),
            "timing_cache": b.supports_timing_cache(trt),
            "implicit_int8": b.supports_implicit_int8(trt), "plans": plans,
            "tactic_sources_off": [n for n in b.EXTERNAL_TACTIC_SOURCES
                                   if b.tactic_sources(trt, 0) is not None
                                   and hasattr(trt.TacticSource, n)]}


caps = capabilities(trt)
b.make_logger(trt)
if caps["progress_monitor"]:
    b.make_progress_monitor(trt, b.ProgressSink())
if caps["implicit_int8"]:
    import numpy as np
    windows = np.zeros((3, 3, 4, 33, 1), np.float32)
    batch, batches = b.calibration_batching(len(windows), 8, True)
    cal = b.make_entropy_calibrator(trt, windows, batch, None)
    caps["calibrator"] = {"batch_size": cal.get_batch_size(), "batches": batches,
                          "is_entropy2": isinstance(cal, trt.IInt8EntropyCalibrator2)}
try:
    trt.Builder(b.make_logger(trt))
    caps["builder"] = "constructed"
except TypeError as e:
    caps["builder"] = "stub"
caps["torch_imported"] = sys.modules.get("torch") is not None
print(json.dumps(caps))
"""


@pytest.fixture(scope="module", params=VERSIONS)
def caps(request) -> dict:
    env = stub_env(request.param)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                       env=env, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_real_bindings_loaded(caps):
    assert caps["version"] in VERSIONS and caps["builder"] == "stub"
    if caps["implicit_int8"]:
        # Three windows and max batch 8: one batch of three, not zero batches of eight.
        assert caps["calibrator"] == {"batch_size": 3, "batches": 1, "is_entropy2": True}
    assert caps["torch_imported"] is False  # the TensorRT path must not import torch


def test_common_choices(caps):
    # build_serialized_network and set_memory_pool_limit exist in all three releases.
    assert caps["build_api"] == "build_serialized_network"
    assert caps["workspace_api"] == "memory_pool"
    assert caps["opt_level"] is True and caps["timing_cache"] is True


def test_version_specific_choices(caps):
    v = caps["version"]
    plans = caps["plans"]
    major = int(v.split(".")[0])
    assert caps["progress_monitor"] is (major >= 10)   # IProgressMonitor arrived in 10.0
    if major == 8:
        # EXPLICIT_BATCH is enum value 0 in 8.6: flags == 1 << 0.
        assert plans["fp32"]["network_flags"] == 1
    elif major == 10:
        assert plans["fp32"]["network_flags"] == 0    # explicit batch is implied in 10.x
    if major <= 10:
        assert caps["implicit_int8"] is True
        assert plans["fp16"]["flags"] == ["FP16"] and not plans["fp16"]["strongly_typed"]
        assert plans["int8-qdq"]["flags"] == ["INT8", "FP16"]
        assert plans["int8-qdq"]["onnx"] == "qdq"
        assert plans["int8-calibrator"]["calibrator"] is True
        assert plans["int8-calibrator"]["onnx"] == "fp32"
    else:
        # 11.x: no FP16/INT8 builder flags, no calibrators; STRONGLY_TYPED is value 0.
        assert caps["implicit_int8"] is False
        assert plans["fp32"] == {"flags": [], "strongly_typed": True, "onnx": "fp32",
                                 "calibrator": False, "network_flags": 1}
        assert "FP16 needs an ONNX whose tensors are float16" in plans["fp16"]["error"]
        assert "--precision int8" in plans["fp16"]["error"]
        assert plans["int8-qdq"]["strongly_typed"] and plans["int8-qdq"]["onnx"] == "qdq"
        assert "--int8-mode qdq" in plans["int8-calibrator"]["error"]


# --- every TensorRT name the builder uses exists in the releases whose path uses it ----------

def parse_api(path: Path) -> dict[str, set[str]]:
    """{'Builder': {'create_network', ...}, 'BuilderFlag': {'FP16', ...}, ...}"""
    api: dict[str, set[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        if line.startswith("enum "):
            name, _, values = line[5:].partition(":")
            api[name.strip()] = {v.strip() for v in values.split(",") if v.strip()}
            current = None
        elif line.startswith("class "):
            current = line[6:].strip()
            api.setdefault(current, set())
        elif current and line.startswith("  "):
            api[current].add(line.split()[0])
    return api


# (class, member) -> releases whose code path uses it (others are behind feature checks).
USED = {
    ("Builder", "create_network"): VERSIONS, ("Builder", "create_builder_config"): VERSIONS,
    ("Builder", "create_optimization_profile"): VERSIONS,
    ("Builder", "build_serialized_network"): VERSIONS,
    ("OnnxParser", "parse_from_file"): VERSIONS, ("OnnxParser", "get_error"): VERSIONS,
    ("OnnxParser", "num_errors"): VERSIONS,
    ("INetworkDefinition", "get_input"): VERSIONS,
    ("IBuilderConfig", "set_memory_pool_limit"): VERSIONS,
    ("IBuilderConfig", "builder_optimization_level"): VERSIONS,
    ("IBuilderConfig", "set_flag"): VERSIONS,
    ("IBuilderConfig", "get_tactic_sources"): VERSIONS,
    ("IBuilderConfig", "set_tactic_sources"): VERSIONS,
    ("TacticSource", "CUBLAS"): ("8.6.1", "10.3.0"),
    ("TacticSource", "CUBLAS_LT"): ("8.6.1", "10.3.0"),
    ("TacticSource", "CUDNN"): ("8.6.1", "10.3.0"),
    ("IBuilderConfig", "add_optimization_profile"): VERSIONS,
    ("IBuilderConfig", "profiling_verbosity"): VERSIONS,
    ("IBuilderConfig", "create_timing_cache"): VERSIONS,
    ("IBuilderConfig", "set_timing_cache"): VERSIONS,
    ("IBuilderConfig", "get_timing_cache"): VERSIONS,
    ("ITimingCache", "combine"): VERSIONS, ("ITimingCache", "serialize"): VERSIONS,
    ("IOptimizationProfile", "set_shape"): VERSIONS,
    ("Runtime", "deserialize_cuda_engine"): VERSIONS,
    ("ICudaEngine", "create_engine_inspector"): VERSIONS,
    ("EngineInspector", "get_engine_information"): VERSIONS,
    ("LayerInformationFormat", "JSON"): VERSIONS,
    ("ProfilingVerbosity", "DETAILED"): VERSIONS,
    ("MemoryPoolType", "WORKSPACE"): VERSIONS,
    ("ILogger", "log"): VERSIONS, ("ILogger", "Severity"): VERSIONS,
    ("NetworkDefinitionCreationFlag", "EXPLICIT_BATCH"): ("8.6.1",),
    ("NetworkDefinitionCreationFlag", "STRONGLY_TYPED"): ("11.4.0.106",),
    ("BuilderFlag", "FP16"): ("8.6.1", "10.3.0"), ("BuilderFlag", "INT8"): ("8.6.1", "10.3.0"),
    ("IBuilderConfig", "int8_calibrator"): ("8.6.1", "10.3.0"),
    ("IBuilderConfig", "set_calibration_profile"): ("8.6.1", "10.3.0"),
    ("IInt8EntropyCalibrator2", "get_batch"): ("8.6.1", "10.3.0"),
    ("IInt8EntropyCalibrator2", "read_calibration_cache"): ("8.6.1", "10.3.0"),
    ("IInt8EntropyCalibrator2", "write_calibration_cache"): ("8.6.1", "10.3.0"),
    ("IInt8EntropyCalibrator2", "get_batch_size"): ("8.6.1", "10.3.0"),
    ("IBuilderConfig", "progress_monitor"): ("10.3.0", "11.4.0.106"),
    ("IProgressMonitor", "phase_start"): ("10.3.0", "11.4.0.106"),
    ("IProgressMonitor", "step_complete"): ("10.3.0", "11.4.0.106"),
    ("IProgressMonitor", "phase_finish"): ("10.3.0", "11.4.0.106"),
}


@pytest.mark.parametrize("version", VERSIONS)
def test_used_names_exist(version):
    path = SHARED / f"api-{version}.txt"
    if not path.exists():
        pytest.skip(f"{path} not found")
    api = parse_api(path)
    for (cls, member), versions in USED.items():
        if version in versions or (version == "10.16.1.11" and "10.3.0" in versions):
            assert member in api.get(cls, set()), f"{cls}.{member} missing in {version}"


def test_every_name_the_builder_touches_is_listed():
    """Attribute names called on TensorRT objects in the builder appear in USED."""
    tree = ast.parse(BUILDER_SRC.read_text())
    members = {m for _, m in USED}
    classes = {c for c, _ in USED}
    trt_objects = {"trt", "builder", "network", "parser", "config", "profile", "runtime",
                   "engine", "cache", "ncf", "sev"}
    missing = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in trt_objects:
            name = node.attr
            if name not in members and name not in classes and name not in {
                    "__version__", "BuilderFlag", "NetworkDefinitionCreationFlag",
                    "IBuilderConfig", "Builder", "OnnxParser", "Runtime", "ILogger",
                    "IProgressMonitor", "IInt8EntropyCalibrator2", "max_workspace_size",
                    "build_engine", "serialize", "num_errors", "shape", "name",
                    "INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "Severity"}:
                missing.add(f"{node.value.id}.{name}")
    assert not missing, f"TensorRT names not checked against the API lists: {missing}"


def test_tactic_sources_without_external_libraries_on_8x(caps):
    """8.5/8.6 enable cuBLAS, cuBLASLt and cuDNN by default (~0.4 GB a process on JetPack 5:
    NVIDIA/TensorRT#2217): stgcnd builds without them there, with the enum members the release
    has; 10.x keeps its defaults (those sources are off by default there, gone in 11.x)."""
    major = int(caps["version"].split(".")[0])
    expected = ["CUBLAS", "CUBLAS_LT", "CUDNN"] if major < 10 else []
    assert caps["tactic_sources_off"] == expected


def test_tactic_source_mask_from_the_release_enum():
    env = stub_env("8.6.1")
    probe = ("import json, tensorrt as trt\n"
             "from stgcnd.engines.builders import tensorrt as b\n"
             "every = sum(1 << int(m) for m in trt.TacticSource.__members__.values())\n"
             "mask = b.tactic_sources(trt, every)\n"
             "print(json.dumps(b.tactic_source_names(trt, mask)))\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       env=env, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS"]
