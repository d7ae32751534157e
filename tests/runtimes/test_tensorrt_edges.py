"""TensorRT's edges (issue #31, item 4), against the real bindings of each release.

- A refused profile (8.x: one in use by another context) raises a RuntimeError from the
  `active_optimization_profile` setter (the async call would end the process there: issue
  #43, tests/runtimes/test_tensorrt_profile_binding.py): it must become stgcnd's error.
- A context gets its activation memory before its profile, then its tensor addresses, each
  checked (a refused `set_tensor_address` was ignored).
- A capture that cannot begin (cuStreamBeginCapture failing) disables graphs instead of
  dropping the runner, and CUresults are named (cuGetErrorName).
- One TensorRT failure is one error line: TensorRT's own errors (a refused profile, an engine
  that does not load) are carried in stgcnd's.

Each release runs in its own subprocess on its stub bindings (tests/trt_stubs.py); the
execution contexts are stand-ins that answer as each release's bindings do.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.trt_stubs import VERSIONS, stub_env

EDGES = r"""
import ctypes, json
import tensorrt as trt
from stgcnd.errors import BackendUnavailable
from stgcnd.log import configure_logging
from stgcnd.runtimes import cuda, cuda_batch
from stgcnd.runtimes import tensorrt_runtime as tb
from tests.trt_stubs import context_stand_in

configure_logging("info", "json")
logger = tb.tensorrt_logger(trt)
calls = []

# The release's own answers to a profile (tests/trt_stubs.py): on 8.x a profile in use is
# refused, and only the property's setter raises (the async call would end the process).
StandIn = context_stand_in(trt, lambda why: logger.log(trt.ILogger.Severity.ERROR, why))

class Context(StandIn):
    def __init__(self, refuse_profile=False, refuse_address=None):
        super().__init__(profiles=4, in_use=(1,) if refuse_profile else ())
        self.refuse_address = refuse_address
    def set_optimization_profile_async(self, profile, stream):
        calls.append(["profile", profile])
        return super().set_optimization_profile_async(profile, stream)
    def _set_profile(self, profile):
        calls.append(["profile", profile])
        StandIn.active_optimization_profile.fset(self, profile)
    if StandIn.active_optimization_profile.fset is not None:
        active_optimization_profile = property(lambda self: self.profile, _set_profile)
    def set_tensor_address(self, name, address):
        calls.append(["address", name])
        return name != self.refuse_address
if hasattr(trt.IExecutionContext, "set_device_memory"):
    Context.set_device_memory = lambda self, a, n: calls.append(["memory", a, n])
else:
    Context.device_memory = property(None, lambda self, a: calls.append(["memory", a]))

def engine_for(context):
    class Engine:
        num_optimization_profiles = 4
    def make(self, *strategy):
        calls.append(["create"])
        return context
    if hasattr(trt, "ExecutionContextAllocationStrategy"):
        Engine.create_execution_context = make
    else:
        Engine.create_execution_context_without_device_memory = make
    return Engine()

def attempt(context):
    calls.clear()
    try:
        tb.prepare_context(trt, engine_for(context), 1, 7, 4096, 512,
                           {"input": 100, "output": 200})
        return None
    except BackendUnavailable as exc:
        return str(exc)

ok = attempt(Context())
order = [c[0] for c in calls]
profile_refused = attempt(Context(refuse_profile=True))
address_refused = attempt(Context(refuse_address="output"))
address_calls = [c[0] for c in calls]

# The binding's own contract, as each release declares it: a bool.
doc = trt.IExecutionContext.set_optimization_profile_async.__doc__ or ""

# A capture that cannot begin: the driver answers cudaErrorStreamCaptureUnsupported (900).
class Driver:
    def cuStreamBeginCapture_v2(self, stream, mode):
        return 900
    def cuStreamEndCapture(self, stream, graph): raise AssertionError("never began")
    def cuGraphInstantiateWithFlags(self, *a): raise AssertionError("never began")
    def cuGraphExecDestroy(self, e): return 0
    def cuGraphDestroy(self, g): return 0
    def cuGetErrorName(self, status, out):
        name = {900: b"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"}.get(status.value)
        if name is None:
            return 1
        ctypes.cast(out, ctypes.POINTER(ctypes.c_char_p))[0] = name
        return 0
cuda._libs = (Driver(), Driver())
try:
    tb.capture_graph(0xABC, lambda: True)
    capture = None
except cuda_batch.GraphsUnavailable as exc:
    capture = ["GraphsUnavailable", str(exc)]
except cuda.CudaError as exc:
    capture = ["CudaError", str(exc)]

# An engine of another TensorRT: deserialize answers None after logging why.
import pathlib, tempfile
from stgcnd.errors import UserError
class Runtime:
    def __init__(self, logger): self.logger = logger
    def deserialize_cuda_engine(self, data):
        self.logger.log(trt.ILogger.Severity.ERROR, "Serialization assertion: version tag")
        return None
trt.Runtime = Runtime
tb.make_current = lambda: None
engine_file = pathlib.Path(tempfile.mkdtemp()) / "model.engine"
engine_file.write_bytes(b"x")
try:
    tb.TensorRTRuntime(engine_file, (3, 30, 33, 1), 2)
    load_refused = None
except UserError as exc:
    load_refused = str(exc)

print(json.dumps({"version": trt.__version__, "ok": ok, "order": order,
                  "load_refused": load_refused,
                  "profile_refused": profile_refused, "address_refused": address_refused,
                  "address_calls": address_calls, "doc": doc, "capture": capture,
                  "named": tb.name_results("failed with CUresult 900; CUresult 7")}))
"""


@pytest.fixture(scope="module", params=VERSIONS)
def edges(request) -> tuple[str, dict, list[dict]]:
    proc = subprocess.run([sys.executable, "-c", EDGES], capture_output=True, text=True,
                          timeout=120, env=stub_env(request.param), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    logged = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    return request.param, json.loads(proc.stdout.strip().splitlines()[-1]), logged


def test_memory_before_profile_before_addresses(edges):
    version, res, _ = edges
    assert res["version"].startswith(version)
    assert res["ok"] is None
    assert res["order"] == ["create", "memory", "profile", "address", "address"]


def test_a_profile_refused_by_raising_is_stgcnds_error_with_tensorrts_reason(edges):
    version, res, _ = edges
    assert ") -> bool" in res["doc"].splitlines()[0]  # declared a bool, yet it raises
    text = res["profile_refused"]
    if not version.startswith("8."):  # 10.x shares a profile between contexts by default
        assert text is None
        return
    assert text is not None, "a RuntimeError from the profile setter escaped"
    assert "optimization profile 1" in text and "8.x" in text
    assert "Error in set optimization profile." in text
    assert "profile 1 is in use by another context" in text


def test_a_refused_tensor_address_is_an_error(edges):
    _, res, _ = edges
    assert res["address_calls"] == ["create", "memory", "profile", "address", "address"]
    assert res["address_refused"] is not None and "'output'" in res["address_refused"]


def test_one_tensorrt_failure_is_one_error_line(edges):
    _, _, logged = edges
    # TensorRT's error is inside stgcnd's error (above), not a line of its own.
    errors = [e for e in logged if e.get("level") in ("error", "critical")]
    assert errors == []


def test_an_engine_that_does_not_load_is_one_error_with_tensorrts_reason(edges):
    _, res, _ = edges
    text = res["load_refused"]
    assert text is not None and "model.engine" in text
    assert "Serialization assertion: version tag" in text and "stgcnd build" in text


def test_a_capture_that_cannot_begin_disables_graphs_with_the_named_result(edges):
    _, res, _ = edges
    kind, text = res["capture"]
    assert kind == "GraphsUnavailable", text
    assert "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (CUresult 900)" in text
    assert res["named"] == ("failed with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (CUresult 900);"
                            " CUresult 7")
