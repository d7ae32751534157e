"""The TensorRT runner on a real GPU, with TensorRT's one call stood in for.

No TensorRT can be installed where these tests run. Everything of `_TrtRunner` but the
engine's `execute_async_v3` runs for real here: contexts planned per bucket, pycuda
allocations, the batch's copies on per-client streams (`cuda_batch.LanedBatch`), CUDA graphs
captured through the driver, and the I/O loop's launch / done / collect from a thread other
than the one that prepared the runner. The stand-in "network" copies each slot's first K
input values into its logits row, so every window's answer is checkable.

Run on the GPU test machine (`pytest -m gpu`); skipped without a GPU or pycuda.
"""

from __future__ import annotations

import ctypes
import threading
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPE = (3, 8, 33, 1)
K = 2
ROW_IN = int(np.prod(SHAPE)) * 4


class _Context:
    """An execution context whose network copies each slot's first K values to its row."""

    def __init__(self) -> None:
        self.addresses: dict[str, int] = {}
        self.batch = 0
        self.enqueued = 0
        lib = ctypes.CDLL("libcuda.so.1")
        self._copy = lib.cuMemcpyDtoDAsync_v2
        self._copy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t,
                               ctypes.c_void_p]

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def set_input_shape(self, name: str, shape: tuple) -> bool:
        self.batch = shape[0]
        return True

    def execute_async_v3(self, stream: int) -> bool:
        self.enqueued += 1
        src, dst = self.addresses["input"], self.addresses["output"]
        for i in range(self.batch):
            if self._copy(dst + i * K * 4, src + i * ROW_IN, K * 4, stream):
                return False
        return True


def _backend(cuda_graph: bool):
    pytest.importorskip("pycuda.driver")
    from stgcnd.backends.base import BackendInfo
    from stgcnd.backends.cuda import init_cuda
    from stgcnd.backends.tensorrt_backend import TensorIO, TensorRTBackend

    init_cuda("pycuda")
    backend = object.__new__(TensorRTBackend)  # everything but the engine, as loaded
    backend.input = TensorIO("input", True, np.dtype(np.float32), (-1, *SHAPE), (8, *SHAPE))
    backend.io = [backend.input,
                  TensorIO("output", False, np.dtype(np.float32), (-1, K), (8, K))]
    backend.dynamic = True
    backend.profile_ranges = [(1, 1, 1), (2, 2, 2), (3, 4, 4), (5, 8, 8)]
    backend.cuda_graph = cuda_graph
    backend.graph_failure = None
    backend._lock = threading.Lock()
    backend.info = BackendInfo(name="tensorrt", precision="fp32", device="cuda:0",
                               input_shape=SHAPE, num_class=K, max_batch=8, artifact=None,
                               details={})
    backend.contexts = []

    def new_context(profile: int, stream: int) -> _Context:
        backend.contexts.append(_Context())
        return backend.contexts[-1]

    backend.new_context = new_context
    return backend


def _expected(windows: list) -> np.ndarray:
    return np.stack([w.astype(np.float32).ravel()[:K] for w in windows])


@pytest.mark.parametrize("lanes", [0, 4])
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_trt_runner_run_from_its_own_thread(cuda_graph, lanes):
    backend = _backend(cuda_graph)
    rng = np.random.default_rng(3)
    runner = backend.open_runner((1, 2, 4, 8), lanes=lanes)
    try:
        assert runner.buckets == (1, 2, 4, 8) and len(backend.contexts) == 4
        est = runner.warm_up(1)
        assert set(est) == {1, 2, 4, 8}
        assert sorted(runner.graphs) == ([1, 2, 4, 8] if cuda_graph else [])
        assert backend.nonblocking_runners is cuda_graph and runner.nonblocking is cuda_graph
        for n in (3, 8, 1):
            windows = [rng.random(SHAPE).astype(np.float32) for _ in range(n)]
            ids = [(5 * i) % lanes if lanes else 0 for i in range(n)]
            out = runner.run(windows, ids)
            np.testing.assert_array_equal(out, _expected(windows))
        graphs_replayed = sum(c.enqueued for c in backend.contexts)
    finally:
        runner.close()
    # With graphs, batches replay them: the contexts were only enqueued to warm and capture.
    # Warm-up: per bucket, a set-up enqueue and a captured one (graphs) or two timed runs.
    assert graphs_replayed == (8 if cuda_graph else 4 * 2 + 3)


def _device_free_bytes() -> int:
    lib = ctypes.CDLL("libcuda.so.1")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    return free.value


def _is_pinned(address: int) -> bool:
    lib = ctypes.CDLL("libcuda.so.1")
    flags = ctypes.c_uint()
    return lib.cuMemHostGetFlags(ctypes.byref(flags), ctypes.c_void_p(address)) == 0


def test_trt_runner_driven_by_another_thread_as_the_loop_does():
    """As a SIGHUP reload does with a loop-driven model: prepared in one thread, attached,
    driven and closed by another (the I/O loop). Every window gets its own answer, and
    closing from the other thread frees everything: no pycuda out-of-thread warning (pycuda
    streams and pinned arrays warned so and leaked), the pinned rows unregistered, and device
    memory back to where it was after eight more reloads."""
    from stgcnd.backends.cuda import pycuda_current

    backend = _backend(cuda_graph=True)
    results: list = []
    pinned_after_close: list = []

    def reload_once(seed: int) -> None:
        made: dict = {}

        def prepare() -> None:
            runner = backend.open_runner((1, 2, 4, 8), lanes=4)
            runner.warm_up(1)
            made["runner"] = runner

        th = threading.Thread(target=prepare)
        th.start()
        th.join()
        runner = made["runner"]
        rows = [int(runner.host_in.ctypes.data), int(runner.host_out.ctypes.data)]

        def drive() -> None:
            runner.attach()
            rng = np.random.default_rng(seed)
            for lanes in ([1, 1, 3], [0, 1, 2, 3, 0], [2]):
                windows = [rng.random(SHAPE).astype(np.float32) for _ in lanes]
                runner.launch(windows, lanes)
                end = time.monotonic() + 5
                while not runner.done() and time.monotonic() < end:
                    pass
                out = runner.collect()
                results.append(bool(np.array_equal(out, _expected(windows)))
                               and runner.last_timings["compute_ms"] >= 0)
            pinned_before = all(_is_pinned(a) for a in rows)
            runner.close()
            runner.close()  # idempotent
            with pycuda_current():
                pinned_after_close.append((pinned_before, any(_is_pinned(a) for a in rows)))

        th = threading.Thread(target=drive)
        th.start()
        th.join()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reload_once(0)  # the first one pays the allocator's one-time growth
        with pycuda_current():
            free_before = _device_free_bytes()
        for seed in range(1, 9):
            reload_once(seed)
        with pycuda_current():
            free_after = _device_free_bytes()
    assert results == [True] * 27
    assert pinned_after_close == [(True, False)] * 9
    out_of_thread = [str(w.message) for w in caught if "out-of-thread" in str(w.message)]
    assert out_of_thread == []
    # Eight leaked runners would hold 8 x (device input + output rows, a graph per bucket).
    assert free_before - free_after < 2 * 1024 * 1024, (free_before, free_after)
