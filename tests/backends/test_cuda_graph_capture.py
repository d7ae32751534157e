"""A failed CUDA-graph capture is cleaned up and not fatal (backends/cuda.py DriverGraph).

No GPU here: libcuda is replaced by a recorder that answers like the driver (CUresult codes,
out-parameters through ctypes). What is checked is the order of driver calls stgcnd makes
when the captured work fails, the way trtexec handles it: the capture is always ended, the
partial graph destroyed, nothing instantiated, and the caller told (False / an exception).
"""

from __future__ import annotations

import ctypes
import json

import pytest

from stgcnd.backends import cuda


class RecordingDriver:
    """cuStream*/cuGraph* with the driver's calling convention; records each call."""

    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901

    def __init__(self, end_status: int = 0) -> None:
        self.calls: list[str] = []
        self.end_status = end_status

    def cuStreamBeginCapture_v2(self, stream, mode):
        self.calls.append("begin")
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

    def cuGraphLaunch(self, exec_, stream):
        self.calls.append("launch")
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
    monkeypatch.setattr(cuda, "_libcuda", rec)
    return rec


def test_capture_success_instantiates_and_launches(driver):
    g = cuda.DriverGraph(0xABC).capture(lambda: True)
    g.launch()
    g.destroy()
    assert driver.calls == ["begin", "end", "instantiate", "launch", "exec_destroy",
                            "graph_destroy"]


def test_failing_work_ends_capture_and_destroys_partial_graph(driver):
    def enqueue():
        raise RuntimeError("TensorRT execute_async_v3 failed")

    with pytest.raises(RuntimeError, match="capture failed: TensorRT execute_async_v3"):
        cuda.DriverGraph(0xABC).capture(enqueue)
    assert driver.calls == ["begin", "end", "graph_destroy"]


def test_work_answering_false_is_a_failure_too(driver):
    graph = cuda.DriverGraph(0xABC)
    assert graph.try_capture(lambda: False, "bucket 4") is False
    assert driver.calls == ["begin", "end", "graph_destroy"]
    assert not graph._graph and not graph._exec


@pytest.fixture
def json_log():
    """The JSON log written to a string; the previous logging set-up restored afterwards."""
    import io

    import structlog

    from stgcnd.log import configure_logging

    previous = structlog.get_config()
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    yield stream
    structlog.configure(**previous)


def test_invalidated_capture_is_logged_once_per_call_and_not_raised(monkeypatch, json_log):
    rec = RecordingDriver(end_status=RecordingDriver.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    monkeypatch.setattr(cuda, "_libcuda", rec)
    assert cuda.DriverGraph(0xABC).try_capture(lambda: True, "batch 1") is False
    assert rec.calls == ["begin", "end", "graph_destroy"]
    lines = [json.loads(x) for x in json_log.getvalue().splitlines() if x.startswith("{")]
    failed = [e for e in lines if e["event"] == "cuda_graph_capture_failed"]
    assert len(failed) == 1 and "901" in failed[0]["error"]
    assert failed[0]["action"] == "running without a CUDA graph"
