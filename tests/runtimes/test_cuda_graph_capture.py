"""A failed CUDA-graph capture is cleaned up and not fatal (runtimes/cuda_batch.py
DriverGraph, and the TensorRT runner's captures).

No GPU here: libcuda is replaced by a recorder that answers like the driver (CUresult codes,
out-parameters through ctypes). What is checked is the order of driver calls stgcnd makes
when the captured work fails, the way trtexec handles it: the capture is always ended, the
partial graph destroyed, nothing instantiated, the caller told (GraphsUnavailable); and a
TensorRT runner whose capture fails says so once and runs without graphs.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest
from structlog.testing import capture_logs

from stgcnd.runtimes import cuda, cuda_batch
from stgcnd.runtimes.tensorrt_runtime import ContextPlan, TensorIO, TensorRTRuntime, TrtRunner


class RecordingDriver:
    """cuStream*/cuGraph* with the driver's calling convention; records each call."""

    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901

    def __init__(self, end_status: int = 0) -> None:
        self.calls: list[str] = []
        self.modes: list[int] = []
        self.end_status = end_status

    def cuStreamBeginCapture_v2(self, stream, mode):
        self.calls.append("begin")
        self.modes.append(mode)
        return 0

    def cuStreamEndCapture(self, stream, graph_out):
        self.calls.append("end")
        # The driver hands back the (partial) graph even when it reports invalidation.
        ctypes.cast(graph_out, ctypes.POINTER(ctypes.c_void_p))[0] = 0x1234
        return self.end_status

    def cuGraphInstantiateWithFlags(self, exec_out, graph, flags):
        self.calls.append("instantiate")
        ctypes.cast(exec_out, ctypes.POINTER(ctypes.c_void_p))[0] = 0x5678
        return 0

    def cuGraphExecDestroy(self, exec_):
        self.calls.append("exec_destroy")
        return 0

    def cuGraphDestroy(self, graph):
        self.calls.append("graph_destroy")
        return 0


@pytest.fixture
def driver(monkeypatch):
    rec = RecordingDriver()
    monkeypatch.setattr(cuda, "_libs", (rec, rec))
    return rec


def test_capture_success_instantiates_and_gives_the_exec_handle(driver):
    g = cuda_batch.DriverGraph(0xABC).capture(lambda: True)
    assert g.exec_handle == 0x5678   # what DriverCalls.launch_graph replays
    g.destroy()
    g.destroy()                      # idempotent: nothing destroyed twice
    assert driver.calls == ["begin", "end", "instantiate", "exec_destroy", "graph_destroy"]
    # Thread-local capture: other threads keep driving their own streams meanwhile.
    assert driver.modes == [1]


def test_failing_work_ends_capture_and_destroys_partial_graph(driver):
    def enqueue():
        raise RuntimeError("TensorRT execute_async_v3 failed")

    with pytest.raises(cuda_batch.GraphsUnavailable,
                       match="capture failed: TensorRT execute_async"):
        cuda_batch.DriverGraph(0xABC).capture(enqueue)
    assert driver.calls == ["begin", "end", "graph_destroy"]


def test_work_answering_false_is_a_failure_too(driver):
    graph = cuda_batch.DriverGraph(0xABC)
    with pytest.raises(cuda_batch.GraphsUnavailable, match="reported failure"):
        graph.capture(lambda: False)
    assert driver.calls == ["begin", "end", "graph_destroy"]
    assert not graph._graph and not graph._exec and graph.exec_handle == 0


def test_invalidated_capture_is_an_error_with_the_drivers_code(monkeypatch):
    rec = RecordingDriver(end_status=RecordingDriver.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    monkeypatch.setattr(cuda, "_libs", (rec, rec))
    with pytest.raises(cuda_batch.GraphsUnavailable, match="CUresult 901"):
        cuda_batch.DriverGraph(0xABC).capture(lambda: True)
    assert rec.calls == ["begin", "end", "graph_destroy"]


def test_a_driver_without_the_graph_api_disables_graphs(monkeypatch):
    class OldDriver:
        def cuStreamBeginCapture_v2(self, stream, mode):
            raise AssertionError("never called")

    monkeypatch.setattr(cuda, "_libs", (OldDriver(), OldDriver()))
    with pytest.raises(cuda_batch.GraphsUnavailable, match="cuStreamEndCapture"):
        cuda_batch.DriverGraph(0xABC)


# --- the TensorRT runner's captures: what a failure leaves behind ---------------------------

class Context:
    """An execution context that enqueues until told to refuse (as execute_async_v3 may
    inside a capture); records what it is asked."""

    def __init__(self, refuse_after: int | None) -> None:
        self.refuse_after = refuse_after
        self.enqueued = 0
        self.shapes: list[tuple] = []

    def set_input_shape(self, name, shape) -> bool:
        self.shapes.append(tuple(shape))
        return True

    def execute_async_v3(self, stream) -> bool:
        self.enqueued += 1
        return self.refuse_after is None or self.enqueued <= self.refuse_after


class Memory:
    def __init__(self) -> None:
        self.synchronized: list[int] = []

    def synchronize(self, stream: int) -> None:
        self.synchronized.append(stream)


def runtime_without_engine() -> TensorRTRuntime:
    runtime = object.__new__(TensorRTRuntime)   # only what a runner's captures read
    runtime.cuda_graph = True
    runtime.graph_failure = None
    runtime._lock = threading.Lock()
    return runtime


def runner_for(runtime: TensorRTRuntime, refuse_after: int | None) -> TrtRunner:
    runner = object.__new__(TrtRunner)
    runner.runtime = runtime
    runner.plan = ContextPlan({1: 0, 2: 1, 4: 2}, per_bucket=True)
    runner.buckets = runner.plan.buckets
    runner.input = TensorIO("input", True, np.dtype(np.float32), (-1, 3, 8, 33, 1),
                            (4, 3, 8, 33, 1))
    runner.contexts = {b: Context(refuse_after) for b in runner.buckets}
    runner.graphs = {}
    runner._shape = {}
    runner.memory = Memory()
    runner.compute = 0xABC
    return runner


def test_trt_runner_captures_a_graph_per_bucket(driver):
    runtime = runtime_without_engine()
    runner = runner_for(runtime, refuse_after=None)
    runner._capture_graphs()
    assert sorted(runner.graphs) == [1, 2, 4]
    # Each bucket: shape set, one uncaptured enqueue (deferred set-up), then the capture.
    assert [c.enqueued for c in runner.contexts.values()] == [2, 2, 2]
    assert [c.shapes for c in runner.contexts.values()] == [
        [(1, 3, 8, 33, 1)], [(2, 3, 8, 33, 1)], [(4, 3, 8, 33, 1)]]
    assert driver.calls == ["begin", "end", "instantiate"] * 3
    assert not cuda_batch.CAPTURE_LOCK.locked()


def test_a_failed_capture_is_said_once_and_the_runtime_stops_capturing(driver):
    runtime = runtime_without_engine()
    with capture_logs() as logs:
        first = runner_for(runtime, refuse_after=1)   # refuses inside every capture
        first._capture_graphs()
        second = runner_for(runtime, refuse_after=1)  # another executor of the same model
        second._capture_graphs()
    assert first.graphs == {} and second.graphs == {}
    # The first bucket's capture failed and was cleaned up; nothing more was tried, by this
    # runner or the next: both compute without graphs (on a worker thread).
    assert driver.calls == ["begin", "end", "graph_destroy"]
    assert [c.enqueued for c in second.contexts.values()] == [0, 0, 0]
    warned = [e for e in logs if e["event"] == "cuda_graphs_disabled"]
    assert len(warned) == 1 and warned[0]["what"] == "bucket 1"
    assert "execute_async_v3 failed" in warned[0]["error"]
    assert runtime.graph_failure == warned[0]["error"]
    assert not cuda_batch.CAPTURE_LOCK.locked()


def test_a_capture_failing_on_a_later_bucket_destroys_the_graphs_already_made(driver):
    runtime = runtime_without_engine()
    runner = runner_for(runtime, refuse_after=None)
    runner.contexts[4].refuse_after = 1
    runner._capture_graphs()
    assert runner.graphs == {}
    assert driver.calls == (["begin", "end", "instantiate"] * 2
                            + ["begin", "end", "graph_destroy"]
                            + ["exec_destroy", "graph_destroy"] * 2)
    assert runtime.graph_failure is not None


def test_a_capture_that_cannot_begin_leaves_the_runner_serving_without_graphs(monkeypatch):
    class Refusing(RecordingDriver):
        def cuStreamBeginCapture_v2(self, stream, mode):
            self.calls.append("begin")
            return 900  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED

    rec = Refusing()
    monkeypatch.setattr(cuda, "_libs", (rec, rec))
    runtime = runtime_without_engine()
    runner = runner_for(runtime, refuse_after=None)
    with capture_logs() as logs:
        runner._capture_graphs()  # a CudaError here would drop the TensorRT runner
    assert runner.graphs == {} and rec.calls == ["begin"]
    (warned,) = [e for e in logs if e["event"] == "cuda_graphs_disabled"]
    assert "did not begin" in warned["error"] and "CUresult 900" in warned["error"]
    assert not cuda_batch.CAPTURE_LOCK.locked()
