"""The TensorRT runtime's version-dependent choices, against the real bindings of each release.

`../shared/tensorrt/stub-bindings.sh VERSION DIR` makes a release's real Python bindings
importable without TensorRT's libraries (nothing can run). Each version is checked in its own
subprocess; a version whose stub cannot be prepared here (no network, no compiler) is skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO
from tests.trt_stubs import VERSIONS, stub_env


def run_with(version: str, code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=stub_env(version), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CHECK = """
import json
import numpy as np
import tensorrt as trt
from stgcnd.errors import BackendUnavailable
from stgcnd.runtimes import import_tensorrt
from stgcnd.runtimes import tensorrt_runtime as tb

mapped, refused = {}, []
for name in dir(trt.DataType):
    if not name.isupper():
        continue
    try:
        mapped[name] = tb.numpy_dtype(getattr(trt.DataType, name)).name
    except BackendUnavailable:
        refused.append(name)
# nptype is TensorRT's own mapping: ours must agree wherever both answer.
agree = {n: np.dtype(trt.nptype(getattr(trt.DataType, n))).name == d for n, d in mapped.items()}

class Engine:  # only the ICudaEngine calls engine_io makes, answering like a built engine
    num_io_tensors = 2
    def get_tensor_name(self, i): return ["input", "output"][i]
    def get_tensor_mode(self, n):
        return trt.TensorIOMode.INPUT if n == "input" else trt.TensorIOMode.OUTPUT
    def get_tensor_shape(self, n): return [-1, 3, 24, 33, 2] if n == "input" else [-1, 2]
    def get_tensor_dtype(self, n): return trt.DataType.FLOAT
    def get_tensor_profile_shape(self, n, p):
        return [[1, 3, 24, 33, 2], [4, 3, 24, 33, 2], [16, 3, 24, 33, 2]]

io = tb.engine_io(trt, Engine(), max_batch=8)
print(json.dumps({"version": tb.version_of(trt), "missing": tb.missing_api(trt),
                  "mapped": mapped, "refused": refused, "agree": agree,
                  "io": [[t.name, t.is_input, t.dtype.name, list(t.max_shape)] for t in io],
                  "ok_import": import_tensorrt() is trt}))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_name_based_api_exists_in_each_release(version):
    res = run_with(version, CHECK)
    assert res["version"].startswith(version)
    assert res["missing"] == []
    assert res["ok_import"]
    assert res["mapped"]["FLOAT"] == "float32" and res["mapped"]["HALF"] == "float16"
    assert res["mapped"]["INT32"] == "int32" and res["mapped"]["BOOL"] == "bool"
    assert all(res["agree"].values()), res["agree"]
    # Types numpy cannot hold are refused with a clear error (BF16 from 10.x, FP4 in 11.x).
    assert "FP8" in res["refused"]
    if not version.startswith("8."):
        assert "BF16" in res["refused"] and res["mapped"]["INT64"] == "int64"
    assert res["io"] == [["input", True, "float32", [8, 3, 24, 33, 2]],
                         ["output", False, "float32", [8, 2]]]


def test_old_bindings_api_would_be_reported():
    # In 10.x the bindings-index API is gone: asking for it must be reported, not crash.
    res = run_with("10.3.0", """
        import json, tensorrt as trt
        from stgcnd.runtimes import tensorrt_runtime as tb
        tb.REQUIRED_API["ICudaEngine"] += ("get_binding_index",)
        tb.REQUIRED_API["IExecutionContext"] += ("execute_async_v2",)
        print(json.dumps(tb.missing_api(trt)))
    """)
    assert res == ["ICudaEngine.get_binding_index", "IExecutionContext.execute_async_v2"]


RUNNER = """
import json
import tensorrt as trt
from stgcnd.provision import load as provision
from stgcnd.engines.builders.tensorrt import make_logger
from stgcnd.engines.options import BuildOptions
from stgcnd.errors import BackendUnavailable
from stgcnd.log import configure_logging
from stgcnd.runtimes import tensorrt_runtime as tb
from tests.trt_stubs import context_stand_in

class Engine:  # a dynamic-batch engine as stgcnd builds it: one profile per bucket 1, 2, 4, 8
    num_io_tensors = 2
    num_optimization_profiles = 4
    def get_tensor_name(self, i): return ["input", "output"][i]
    def get_tensor_mode(self, n):
        return trt.TensorIOMode.INPUT if n == "input" else trt.TensorIOMode.OUTPUT
    def get_tensor_shape(self, n): return [-1, 3, 24, 33, 2] if n == "input" else [-1, 2]
    def get_tensor_dtype(self, n): return trt.DataType.FLOAT
    def get_tensor_profile_shape(self, n, p):
        low, high = [(1, 1), (2, 2), (3, 4), (5, 8)][p]
        return [[low, 3, 24, 33, 2], [high, 3, 24, 33, 2], [high, 3, 24, 33, 2]]

Context = context_stand_in(trt)  # answers a profile as this release's binding does

engine = Engine()
ranges = tb.profile_batch_ranges(engine, "input")
io = tb.engine_io(trt, engine, max_batch=64)
good = Context(profiles=4)
tb.set_profile(trt, good, 2, 123, 4)
try:
    tb.set_profile(trt, Context(profiles=1), 1, 0, 1)
    refused = None
except BackendUnavailable as exc:
    refused = str(exc)

# The one logger of the process (the builder's too), routed into the JSON log with each
# release's own severity enum.
configure_logging("debug", "json")
lg = tb.tensorrt_logger(trt)
same = lg is tb.tensorrt_logger(trt) and lg is make_logger(trt)
mark = lg.error_count
for sev in ("VERBOSE", "INFO", "WARNING", "ERROR", "INTERNAL_ERROR"):
    lg.log(getattr(trt.ILogger.Severity, sev), f"message {sev}")
fp16 = provision.serving_options(BuildOptions(precision="fp16", device="cuda"))
fp32 = provision.serving_options(BuildOptions(precision="fp32", device="cuda"))
print(json.dumps({"ranges": ranges, "io_max": [list(t.max_shape) for t in io],
                  "good_profile": good.profile, "refused": refused,
                  "is_ilogger": isinstance(lg, trt.ILogger), "same": same,
                  "errors": lg.errors_since(mark), "serving_fp16": fp16.precision,
                  "serving_fp32": fp32.precision, "required_missing": tb.missing_api(trt)}))
"""


@pytest.fixture(scope="module", params=VERSIONS)
def runner_check(request) -> tuple[str, dict, str]:
    proc = subprocess.run([sys.executable, "-c", RUNNER], capture_output=True, text=True,
                          timeout=120, env=stub_env(request.param), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return request.param, json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_profiles_bind_checked_and_bounded(runner_check):
    _version, res, _log = runner_check
    assert res["required_missing"] == []
    assert res["ranges"] == [[1, 1, 1], [2, 2, 2], [3, 4, 4], [5, 8, 8]]
    # The largest batch is the largest any profile takes (not profile 0's).
    assert res["io_max"] == [[8, 3, 24, 33, 2], [8, 2]]
    assert res["good_profile"] == 2
    assert "optimization profile 1" in res["refused"] and "8.x" in res["refused"]


def test_one_structured_logger_routes_tensorrt_messages(runner_check):
    _version, res, stderr = runner_check
    assert res["is_ilogger"] and res["same"]
    assert res["errors"] == ["message ERROR", "message INTERNAL_ERROR"]
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    got = {e["message"]: (e["level"], e["severity"]) for e in events
           if e.get("event") == "tensorrt_log"}
    assert got == {"message INFO": ("debug", "info"), "message WARNING": ("warning", "warning"),
                   "message ERROR": ("error", "error"),
                   "message INTERNAL_ERROR": ("critical", "internal_error")}


def test_fp16_config_on_tensorrt_11_serves_fp32_with_a_log(runner_check):
    version, res, stderr = runner_check
    assert res["serving_fp32"] == "fp32"
    if version.startswith("11."):
        assert res["serving_fp16"] == "fp32"
        fallback = [json.loads(line) for line in stderr.splitlines()
                    if '"precision_fallback"' in line]
        assert fallback and fallback[0]["using"] == "fp32"
        assert "strongly typed" in fallback[0]["reason"]
    else:
        assert res["serving_fp16"] == "fp16"
        assert '"precision_fallback"' not in stderr


def test_context_plans():
    from stgcnd.errors import UserError
    from stgcnd.runtimes.tensorrt_runtime import graphs_allowed, plan_contexts

    per_bucket = [(1, 1, 1), (2, 2, 2), (3, 4, 4), (5, 8, 8)]
    plan = plan_contexts((1, 2, 4, 8), per_bucket, dynamic=True)
    assert plan.per_bucket and plan.profiles == {1: 0, 2: 1, 4: 2, 8: 3}
    # A bucket inside a profile's range widens to it: never two contexts on one profile.
    plan = plan_contexts((1, 3, 4, 6), per_bucket, dynamic=True)
    assert plan.profiles == {1: 0, 4: 2, 8: 3} and plan.buckets == (1, 4, 8)
    assert graphs_allowed(plan)
    # An engine with one profile (built before per-bucket profiles): one context, shapes in
    # turn, and no CUDA graphs across shape changes.
    single = plan_contexts((1, 2, 4, 8), [(1, 4, 8)], dynamic=True)
    assert not single.per_bucket and set(single.profiles.values()) == {0}
    assert not graphs_allowed(single)
    assert graphs_allowed(plan_contexts((1,), [(1, 1, 1)], dynamic=False))
    with pytest.raises(UserError, match="no optimization profile"):
        plan_contexts((16,), per_bucket, dynamic=True)
