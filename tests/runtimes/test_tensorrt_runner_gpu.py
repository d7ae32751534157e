"""The TensorRT runner on a real GPU, with TensorRT's one call stood in for.

No TensorRT can be installed where these tests run. Everything of `TrtRunner` but the
engine's `execute_async_v3` runs for real here: contexts planned per bucket and sharing one
activation buffer, driver-layer allocations (runtimes/cuda.py), the batch's copies on
per-client streams (`cuda_batch.LanedBatch`), CUDA graphs captured through the driver, and
the I/O loop's launch / done / collect from a thread other than the one that prepared the
runner. The stand-in "network" copies each slot's first K input values into its logits row,
so every window's answer is checkable.

Run on the GPU test machine (`pytest -m gpu`); skipped without a GPU.
"""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

from stgcnd.runtimes import gpu_present

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="needs a CUDA GPU")]

SHAPE = (3, 8, 33, 1)
K = 2
ROW_IN = int(np.prod(SHAPE)) * 4
ACTIVATION_BYTES = {0: 1 << 20, 1: 2 << 20, 2: 3 << 20, 3: 4 << 20}


class _Context:
    """An execution context whose network copies each slot's first K values to its row."""

    def __init__(self, profile: int) -> None:
        self.profile = profile
        self.addresses: dict[str, int] = {}
        self.memory: tuple[int, int] | None = None
        self.batch = 0
        self.enqueued = 0
        lib = ctypes.CDLL("libcuda.so.1")
        self._copy = lib.cuMemcpyDtoDAsync_v2
        self._copy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t,
                               ctypes.c_void_p]

    def set_device_memory(self, address: int, nbytes: int) -> None:
        self.memory = (address, nbytes)

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


class _Engine:
    """The one engine query a runner makes itself: activation memory per profile."""

    def get_device_memory_size_for_profile_v2(self, profile: int) -> int:
        return ACTIVATION_BYTES[profile]


def _runtime(cuda_graph: bool):
    from stgcnd.runtimes.base import RuntimeInfo
    from stgcnd.runtimes.cuda import make_current
    from stgcnd.runtimes.tensorrt_runtime import TensorIO, TensorRTRuntime

    make_current()
    runtime = object.__new__(TensorRTRuntime)  # everything but the engine, as loaded
    runtime.engine = _Engine()
    runtime.input = TensorIO("input", True, np.dtype(np.float32), (-1, *SHAPE), (8, *SHAPE))
    runtime.io = [runtime.input,
                  TensorIO("output", False, np.dtype(np.float32), (-1, K), (8, K))]
    runtime.dynamic = True
    runtime.profile_ranges = [(1, 1, 1), (2, 2, 2), (3, 4, 4), (5, 8, 8)]
    runtime.cuda_graph = cuda_graph
    runtime.graph_failure = None
    runtime._lock = threading.Lock()
    runtime.profiles_in_use = set()
    runtime.info = RuntimeInfo(name="tensorrt", precision="fp32", device="cuda:0",
                               input_shape=SHAPE, num_class=K, max_batch=8, artifact=None,
                               details={})
    runtime.contexts = []

    def new_context(profile: int, stream: int, memory: int, nbytes: int,
                    addresses: dict) -> _Context:
        context = _Context(profile)
        context.set_device_memory(memory, nbytes)  # the order prepare_context keeps
        for name, ptr in addresses.items():
            context.set_tensor_address(name, ptr)
        runtime.contexts.append(context)
        return context

    runtime.new_context = new_context
    return runtime


def _expected(windows: list) -> np.ndarray:
    return np.stack([w.astype(np.float32).ravel()[:K] for w in windows])


@pytest.mark.parametrize("lanes", [0, 4])
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_trt_runner_run_from_its_own_thread(cuda_graph, lanes):
    from stgcnd.runtimes.base import InWorker
    from stgcnd.runtimes.tensorrt_runtime import TrtRunner

    runtime = _runtime(cuda_graph)
    rng = np.random.default_rng(3)
    runner = runtime.open_runner((1, 2, 4, 8), lanes=lanes)
    try:
        # With graphs a launch only enqueues: the loop polls it. Without, a worker computes.
        inner = runner.inner if isinstance(runner, InWorker) else runner
        assert isinstance(inner, TrtRunner)
        assert isinstance(runner, InWorker) is not cuda_graph
        assert runner.buckets == (1, 2, 4, 8) and len(runtime.contexts) == 4
        assert [c.profile for c in runtime.contexts] == [0, 1, 2, 3]
        # One activation buffer, as large as the largest profile's need, for every context.
        assert inner.activation_bytes == 4 << 20
        assert len({c.memory for c in runtime.contexts}) == 1
        assert runtime.contexts[0].memory[1] == 4 << 20
        est = runner.warm_up(1)
        assert set(est) == {1, 2, 4, 8}
        assert sorted(inner.graphs) == ([1, 2, 4, 8] if cuda_graph else [])
        for n, dtype in ((3, np.float32), (8, np.float32), (1, np.float32), (5, np.float16)):
            windows = [rng.random(SHAPE).astype(dtype) for _ in range(n)]
            ids = [(5 * i) % lanes if lanes else 0 for i in range(n)]
            out = runner.run(windows, ids)
            np.testing.assert_array_equal(out, _expected(windows))
        enqueued = sum(c.enqueued for c in runtime.contexts)
    finally:
        runner.close()
    # With graphs, batches replay them: the contexts were only enqueued to warm and capture.
    # Warm-up: per bucket, a set-up enqueue and a captured one (graphs) or two timed runs.
    assert enqueued == (8 if cuda_graph else 4 * 2 + 4)


def _is_pinned(address: int) -> bool:
    lib = ctypes.CDLL("libcuda.so.1")
    flags = ctypes.c_uint()
    return lib.cuMemHostGetFlags(ctypes.byref(flags), ctypes.c_void_p(address)) == 0


def test_trt_runner_driven_by_another_thread_as_the_loop_does():
    """As a SIGHUP reload does with a loop-driven model: prepared in one thread, attached,
    driven and closed by another (the I/O loop). Every window gets its own answer, and
    closing from the other thread frees everything: the pinned rows unregistered, and device
    memory back to where it was after eight more reloads."""
    from stgcnd.runtimes.cuda import make_current, memory_info

    runtime = _runtime(cuda_graph=True)
    results: list = []
    pinned_after_close: list = []
    errors: list = []

    def reload_once(seed: int) -> None:
        made: dict = {}

        def prepare() -> None:
            runner = runtime.open_runner((1, 2, 4, 8), lanes=4)
            runner.warm_up(1)
            made["runner"] = runner

        th = threading.Thread(target=prepare)
        th.start()
        th.join()
        runner = made["runner"]
        rows = [int(runner.host_in.ctypes.data), int(runner.host_out.ctypes.data)]

        def drive() -> None:
            try:
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
                pinned_after_close.append((pinned_before, any(_is_pinned(a) for a in rows)))
            except BaseException as exc:
                errors.append(exc)

        th = threading.Thread(target=drive)
        th.start()
        th.join()

    reload_once(0)  # the first one pays the driver's one-time growth
    free_before = memory_info()[0]
    for seed in range(1, 9):
        reload_once(seed)
    make_current()
    free_after = memory_info()[0]
    assert not errors, errors
    assert results == [True] * 27
    assert pinned_after_close == [(True, False)] * 9
    # Eight leaked runners would hold 8 x (activations 4 MB, device rows, a graph per bucket).
    assert free_before - free_after < 2 * 1024 * 1024, (free_before, free_after)
