"""CUDA runners of the torch runtime, and the driver layer under the TensorRT runtime
(runtimes/cuda.py, cuda_batch.py) on torch's primary context.

Run on the GPU test machine: `pytest -m gpu tests/runtimes`. Skipped without a GPU.
"""

from __future__ import annotations

import ctypes
import gc
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from stgcnd.model.reference import reference_logits
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.runtimes.torch_runtime import TorchRuntime
from tests.runtimes.conftest import fp16_tol, opened, parity_tol, run_in_thread


@pytest.fixture(scope="module")
def gpu_windows(small_model):
    spec = small_model.spec
    return synthetic_windows(16, spec.frames, spec.persons, spec.num_node, seed=21)


@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_parity(small_model, gpu_windows, precision, cuda_graph):
    ref = reference_logits(small_model, gpu_windows)
    tol = parity_tol(precision, ref)
    with TorchRuntime(small_model, precision, "cuda", cuda_graph=cuda_graph,
                      max_batch=16) as runtime, \
            opened(runtime, (1, 2, 4, 8, 16), lanes=4) as runner:
        assert runtime.info.device.startswith("cuda")
        full = runner.run(list(gpu_windows))
        ones = np.concatenate([runner.run([w]) for w in gpu_windows[:4]])
        again = runner.run(list(gpu_windows))   # a replayed graph gives the same answer
        assert {"compute_ms", "total_ms"} <= set(runner.last_timings)
    assert np.max(np.abs(full - ref)) <= tol
    assert np.max(np.abs(ones - ref[:4])) <= tol
    # Repeated runs agree to far below the tolerance (cuDNN may pick kernels whose reduction
    # order, hence last bits, varies between calls; a bitwise check flaked once on the H100).
    np.testing.assert_allclose(full, again, rtol=0, atol=tol / 100)
    assert np.array_equal(full.argmax(1), ref.argmax(1))


def test_eager_cuda_baseline(small_model, gpu_windows):
    ref = reference_logits(small_model, gpu_windows)
    with TorchRuntime(small_model, "fp32", "cuda", optimized=False, max_batch=16) as runtime, \
            opened(runtime, (16,)) as runner:
        assert runtime.module is not small_model.module   # the caller's network stays put
        assert np.max(np.abs(runner.run(list(gpu_windows)) - ref)) <= 1e-4
    assert next(small_model.module.parameters()).device.type == "cpu"


@pytest.mark.parametrize("precision,cuda_graph", [("fp32", False), ("fp16", True)])
def test_concurrent_runners_match_sequential(small_model, gpu_windows, precision, cuda_graph):
    """Eight executors' runners, prepared in turn by one thread and driven at once by eight
    others. Equal up to rounding: runners that autotune at different times may get different
    cuDNN algorithms (seen on the H100, 1e-3 and once 2.9e-3 in fp16); fp16's parity bound
    (fp16_tol: ~1.3e-2 here) still catches any mix-up of buffers, the windows' logits
    differing by ~1e-1."""
    with TorchRuntime(small_model, precision, "cuda", cuda_graph=cuda_graph,
                      max_batch=4) as runtime:
        with opened(runtime, (2,), lanes=2) as runner:
            expected = [runner.run(list(gpu_windows[i:i + 2])) for i in range(0, 16, 2)]
        runners = [runtime.open_runner((2,), lanes=2) for _ in range(8)]
        results: dict[int, list[np.ndarray]] = {}
        errors: list[BaseException] = []

        def drive(k: int) -> None:
            try:
                runners[k].attach()
                results[k] = [runners[k].run(list(gpu_windows[i:i + 2])) for _ in range(5)
                              for i in range(0, 16, 2)]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=drive, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for runner in runners:
            runner.close()
    assert not errors, errors
    assert len(results) == 8
    atol = 1e-5 if precision == "fp32" else fp16_tol(np.concatenate(expected))
    for outs in results.values():
        for j, got in enumerate(outs):
            np.testing.assert_allclose(got, expected[j % 8], rtol=0, atol=atol)


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_many_cuda_runners_return_memory(small_model, gpu_windows, cuda_graph):
    """A reload opens new runners and closes the old: device memory, pinned buffers and
    worker threads all come back."""
    x = list(gpu_windows[:2])

    def cycle(runtime) -> None:   # nothing of the runner outlives this call
        with opened(runtime, (1, 2), lanes=2) as runner:
            runner.run(x)

    with TorchRuntime(small_model, "fp16", "cuda", cuda_graph=cuda_graph,
                      max_batch=2) as runtime:
        # torch hands out streams from a pool of 32 and keeps one cuBLAS workspace per stream
        # it has seen: go round the pool first, so that only a per-runner leak remains.
        for _ in range(40 if cuda_graph else 3):
            cycle(runtime)
        gc.collect()
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
        threads = threading.active_count()
        # Without graphs each runner's new worker thread pays torch's per-thread CUDA set-up
        # again on its first batch (~0.6 s a runner on the H100), so fewer of those.
        n = 100 if cuda_graph else 30
        for _ in range(n):
            cycle(runtime)
        gc.collect()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == baseline, (
            torch.cuda.memory_allocated() - baseline)
        assert threading.active_count() == threads


def test_the_driver_layer_joins_torchs_primary_context_and_graphs_replay():
    """The TensorRT runtime's plumbing without TensorRT, in a thread of its own (as a
    runner's preparing thread): the primary context made current, memory that torch
    allocated read by the driver layer (one context), pinned and device memory, copies on a
    stream, and a driver-API graph of them replayed by handle."""
    from stgcnd.runtimes.cuda import make_current, primary_context
    from stgcnd.runtimes.cuda_batch import (
        CU_EVENT_DISABLE_TIMING,
        DriverCalls,
        DriverGraph,
        DriverMemory,
    )

    t = torch.arange(1024, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    ctx = primary_context()
    assert ctx and primary_context() == ctx
    result: list = []

    def work() -> None:
        make_current()
        current = ctypes.c_void_p()
        lib = ctypes.CDLL("libcuda.so.1")
        assert lib.cuCtxGetCurrent(ctypes.byref(current)) == 0
        result.append(current.value == ctx)   # torch's context, not one of our own
        memory = DriverMemory()
        calls = DriverCalls(0)
        try:
            stream = memory.stream()
            host = memory.pinned((1024,), np.float32)
            host2 = memory.pinned((1024,), np.float32)
            dev = memory.device_zeros(host.nbytes, stream)
            # A torch allocation read through the driver: both live in the same context.
            assert calls.dtoh(host.ctypes.data, t.data_ptr(), host.nbytes, stream) == 0
            memory.synchronize(stream)
            result.append(bool(np.array_equal(host, np.arange(1024, dtype=np.float32))))
            host2[:] = -1.0
            memory.upload(dev, host2)   # synchronous: device_zeros' zeros overwritten

            def copies() -> bool:
                return not (calls.htod(dev, host.ctypes.data, host.nbytes, stream)
                            | calls.dtoh(host2.ctypes.data, dev, host.nbytes, stream))

            graph = DriverGraph(stream).capture(copies)
            done = calls.event(CU_EVENT_DISABLE_TIMING)
            for value in (1.0, 2.0, 3.0):
                host[:] = value
                assert calls.launch_graph(graph.exec_handle, stream) == 0
                assert calls.record(done, stream) == 0
                assert calls.synchronize(done) == 0
                result.append(bool(np.all(host2 == value)))
            graph.destroy()
        finally:
            calls.destroy()
            memory.free()
        assert memory.device == [] and memory.host == [] and memory.streams == []

    run_in_thread(work)
    assert result == [True] * 5


def test_laned_batch_on_driver_memory_driven_from_another_thread():
    """The batch plumbing the TensorRT runner uses (cuda_batch.LanedBatch) on DriverMemory
    allocations, with a driver graph standing in for the engine: prepared in one thread,
    driven from another that only makes the context current (the I/O loop), each window's
    row back in its own slot whatever its lane and dtype, over a few batches."""
    from stgcnd.runtimes.cuda import make_current
    from stgcnd.runtimes.cuda_batch import DriverGraph, DriverMemory, LanedBatch

    rows, window, k = 4, (3, 5), 2
    made: dict = {}

    def prepare() -> None:
        make_current()
        memory = DriverMemory()
        compute = memory.stream()
        lanes = [memory.stream() for _ in range(4)]
        host_in = memory.pinned((rows, *window), np.float32)
        host_out = memory.pinned((rows, k), np.float32)
        dev_in = memory.device_zeros(host_in.nbytes, compute)
        dev_out = memory.device_zeros(host_out.nbytes, compute)
        row_in, row_out = host_in[0].nbytes, host_out[0].nbytes
        lib = ctypes.CDLL("libcuda.so.1")
        dtod = lib.cuMemcpyDtoDAsync_v2
        dtod.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]

        def network() -> bool:  # each slot's logits: the first k values of its window
            return not any(dtod(dev_out + i * row_out, dev_in + i * row_in, row_out, compute)
                           for i in range(rows))

        graph = DriverGraph(compute).capture(network)
        made.update(batch=LanedBatch(host_in, host_out, dev_in, compute, lanes),
                    graph=graph, dev_out=dev_out, memory=memory)

    def drive() -> None:
        make_current()
        batch = made["batch"]
        batch.poll_only()
        rng = np.random.default_rng(5)
        for lanes, dtype in (([2, 0, 3], np.float32), ([1, 1, 0, 2], np.float16),
                             ([3], np.float32)):
            windows = [rng.random(window).astype(dtype) for _ in lanes]
            batch.stage(windows)
            bad = batch.upload(lanes) | batch.start()
            bad |= batch.ops.launch_graph(made["graph"].exec_handle, batch.compute_stream)
            batch.finish(made["dev_out"], lanes, bad)
            for _ in range(1_000_000):
                if batch.done():
                    break
            logits, compute_ms = batch.collect()
            want = np.stack([w.astype(np.float32).ravel()[:k] for w in windows])
            result.append((logits.dtype == np.float32, bool(np.array_equal(logits, want)),
                           compute_ms >= 0))

    result: list = []
    run_in_thread(prepare)
    run_in_thread(drive)

    def free() -> None:   # from a third thread: any thread may close a runner
        make_current()
        made["memory"].synchronize_all()
        made["graph"].destroy()
        made["batch"].destroy()
        made["memory"].free()

    run_in_thread(free)
    assert result == [(True, True, True)] * 3
