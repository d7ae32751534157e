"""HostRunner and InWorker (runtimes/base.py), with a numpy network: every batch size its own
bucket, warm-up estimates scaled from batch 1, and a blocking runner driven from the I/O
loop's thread through a worker that wakes the loop, raises the worker's errors on collect,
and ends with close."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from stgcnd.model.synthetic import synthetic_windows
from stgcnd.runtimes.base import HostRunner, InWorker, Runtime, RuntimeInfo

SHAPE = (3, 8, 33, 1)
K = 3


def network(batch: np.ndarray) -> np.ndarray:
    """Each window's logits: its sums over three slices (any window gives its own answer)."""
    flat = batch.reshape(len(batch), -1).astype(np.float64)
    return np.stack([flat[:, i::K].sum(1) for i in range(K)], axis=1)


class NumpyRuntime(Runtime):
    """A CPU runtime whose compute is `network`, recording the batches and threads it saw;
    each batch ends only once `gate` is open (it is, unless a test closes it), `fail` makes
    one raise."""

    def __init__(self, max_batch: int = 8) -> None:
        self.info = RuntimeInfo(name="numpy", precision="fp32", device="cpu",
                                input_shape=SHAPE, num_class=K, max_batch=max_batch)
        self.gate = threading.Event()
        self.gate.set()
        self.finished = 0  # batches computed to the end
        self.batches: list[int] = []
        self.threads: set[str] = set()
        self.fail: BaseException | None = None

    def _open_runner(self, buckets, lanes):
        return HostRunner(self.info, self.compute, buckets, lanes)

    def compute(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        assert batch.dtype == np.float32 and batch.shape[1:] == SHAPE
        self.threads.add(threading.current_thread().name)
        self.batches.append(len(batch))
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        assert self.gate.wait(30), "the gate never opened"
        self.finished += 1
        return network(batch).astype(np.float32), 0.25 * len(batch)


def windows(n: int, seed: int = 0) -> list[np.ndarray]:
    return list(synthetic_windows(n, SHAPE[1], SHAPE[3], SHAPE[2], seed=seed))


def expected(ws: list[np.ndarray]) -> np.ndarray:
    return network(np.stack([w.astype(np.float32) for w in ws])).astype(np.float32)


def test_every_batch_size_is_its_own_bucket():
    runtime = NumpyRuntime(max_batch=8)
    host = runtime._open_runner((1, 4, 8), lanes=2)
    assert host.blocking and host.buckets == tuple(range(1, 9))
    for n in (1, 3, 5, 8):
        assert host.bucket_for(n) == n
        ws = windows(n, seed=n)
        np.testing.assert_allclose(host.run(ws), expected(ws), rtol=1e-6)
    assert runtime.batches == [1, 3, 5, 8]   # never padded to a larger shape
    assert host.last_timings["compute_ms"] == pytest.approx(2.0)
    assert host.last_timings["total_ms"] >= 0
    # Bounded by the largest bucket asked for, within what the runtime takes.
    assert runtime._open_runner((1, 2), 0).buckets == (1, 2)
    assert runtime._open_runner((64,), 0).buckets == tuple(range(1, 9))


def test_host_runner_results_are_the_callers_and_float16_is_widened():
    runtime = NumpyRuntime()
    host = runtime._open_runner((4,), 0)
    ws = windows(2, seed=1)
    out = host.run(ws)
    out[:] = 99.0   # the caller owns its result: the runner's next answer is unaffected
    np.testing.assert_allclose(host.run(ws), expected(ws), rtol=1e-6)
    half = [w.astype(np.float16) for w in ws]
    np.testing.assert_allclose(host.run(half), expected(half), rtol=1e-6)


def test_warm_up_measures_batch_one_and_scales_it():
    runtime = NumpyRuntime(max_batch=4)
    host = runtime._open_runner((1, 2, 4), 0)
    est = host.warm_up(runs=2)
    assert set(runtime.batches) == {1}   # only batch 1 is run: a CPU's cost is linear
    assert len(runtime.batches) == 3     # runs + 1 (the first pays lazy set-up)
    assert est == {1: 0.25, 2: 0.5, 3: 0.75, 4: 1.0}
    assert sorted(host.wall_ms) == [1, 2, 3, 4]
    assert host.wall_ms[4] == pytest.approx(4 * host.wall_ms[1])


def test_a_blocking_runner_is_opened_in_a_worker():
    runtime = NumpyRuntime(max_batch=4)
    runner = runtime.open_runner((1, 2, 4), lanes=4)
    try:
        assert isinstance(runner, InWorker) and isinstance(runner.inner, HostRunner)
        assert runner.blocking   # the loop never computes: the worker wakes it
        assert runner.buckets == (1, 2, 3, 4) and runner.max_batch == 4
        est = runner.warm_up(runs=1)
        assert est == {1: 0.25, 2: 0.5, 3: 0.75, 4: 1.0} and runner.compute_ms == est
        assert runtime.threads == {"worker-numpy"}   # warmed where it will run
    finally:
        runner.close()


def test_driven_from_the_loops_thread_the_worker_wakes_the_loop():
    """As the I/O loop drives it: launch returns while the worker computes; the worker calls
    the waker (here a self-pipe, as the loop's) once the batch is done; collect gives that
    batch's logits. The loop never blocks on the compute."""
    runtime = NumpyRuntime(max_batch=4)
    runner = runtime.open_runner((1, 2, 4), lanes=4)
    read_fd, write_fd = os.pipe()
    wakers: list[str] = []

    def wake() -> None:
        wakers.append(threading.current_thread().name)
        os.write(write_fd, b"x")

    runner.set_waker(wake)
    got: list[tuple[bool, bool, np.ndarray, np.ndarray]] = []
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            runner.attach()
            for n, lanes in ((3, [2, 0, 2]), (1, [3]), (4, [0, 1, 2, 3])):
                ws = windows(n, seed=10 + n)
                runtime.gate.clear()  # the compute cannot end before launch returns
                finished = runtime.finished
                runner.launch(ws, lanes)
                returned_first = runtime.finished == finished
                done_at_once = runner.done()
                runtime.gate.set()
                assert os.read(read_fd, 1) == b"x"   # the loop sleeps until woken
                assert runner.done()
                got.append((returned_first, done_at_once, runner.collect(), expected(ws)))
        except BaseException as exc:
            errors.append(exc)

    try:
        t = threading.Thread(target=loop, name="io-loop")
        t.start()
        t.join(30)
    finally:
        runner.close()
        os.close(read_fd)
        os.close(write_fd)
    assert not errors, errors
    assert len(got) == 3
    for returned_first, done_at_once, out, want in got:
        assert returned_first, "launch returned after the compute: it must not compute"
        assert not done_at_once
        np.testing.assert_allclose(out, want, rtol=1e-6)
    assert wakers == ["worker-numpy"] * 3       # woken from the worker, once a batch
    assert runtime.threads == {"worker-numpy"}  # computed there, never on the loop
    assert runner.last_timings["compute_ms"] == pytest.approx(1.0)


def test_an_error_in_the_worker_is_raised_on_collect_and_the_runner_goes_on():
    runtime = NumpyRuntime(max_batch=2)
    runner = runtime.open_runner((1, 2), lanes=0)
    woken = threading.Event()
    runner.set_waker(woken.set)
    try:
        runtime.fail = MemoryError("out of memory in the network")
        runner.launch(windows(2), [0, 0])
        assert woken.wait(10)    # a failed batch wakes the loop too: its cameras get answers
        assert runner.done()
        with pytest.raises(MemoryError, match="out of memory"):
            runner.collect()
        ws = windows(1, seed=5)
        np.testing.assert_allclose(runner.run(ws), expected(ws), rtol=1e-6)
        # A warm-up that fails raises in the caller too.
        runtime.fail = RuntimeError("broken at warm-up")
        with pytest.raises(RuntimeError, match="broken at warm-up"):
            runner.warm_up(1)
        np.testing.assert_allclose(runner.run(ws), expected(ws), rtol=1e-6)
    finally:
        runner.close()


def test_close_ends_the_worker_thread():
    runtime = NumpyRuntime()
    before = threading.active_count()
    runners = [runtime.open_runner((1,), 0) for _ in range(20)]
    for runner in runners:
        runner.run(windows(1))
    assert threading.active_count() == before + 20
    for runner in runners:
        runner.close()
    assert all(not r._thread.is_alive() for r in runners)
    assert threading.active_count() == before
