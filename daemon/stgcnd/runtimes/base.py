"""The contract every runtime meets (Polygraphy's loader/runner split): `Runtime` and
`Runner`, described above `Runner`. A runner whose compute blocks the calling thread says so
(`blocking`) and is run by an `InWorker` thread that wakes the loop (an InWorker is blocking
too: the executor reads the one flag); a non-blocking one only enqueues device work and is
polled.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import numpy as np

from stgcnd.model.synthetic import synthetic_windows
from stgcnd.threadname import name_os_thread

_T = TypeVar("_T")


@dataclass(frozen=True)
class RuntimeInfo:
    """What a loaded runtime is, for logs, `hello` replies and bench tables."""

    name: str                       # "tensorrt", "torch", "onnxruntime", "noop"
    precision: str                  # "fp32", "fp16", "int8"
    device: str                     # "cpu", "cuda:0"
    input_shape: tuple[int, ...]    # one window (3, T, V, M)
    num_class: int
    max_batch: int                  # largest batch a runner takes
    artifact: str | None = None     # the file it runs, if any
    details: dict[str, object] = field(default_factory=dict)


def normalize_buckets(buckets: Sequence[int], max_batch: int) -> tuple[int, ...]:
    """Sorted unique bucket sizes within 1..max_batch, always including 1 and the largest
    size allowed (so that every batch the scheduler may form has a bucket)."""
    top = max(1, min(max(buckets, default=1), max_batch))
    return tuple(sorted({1, top, *(b for b in buckets if 1 <= b <= top)}))


def warm_median(times: Sequence[float]) -> float:
    """The median, leaving out the first run (it pays lazy set-up) when there are others."""
    warm = sorted(times[1:] or times)
    return warm[len(warm) // 2]


# A `Runtime` is a model loaded into one inference library (TensorRT, PyTorch, ONNX Runtime, or
# the `noop` stand-in): it owns the weights or the engine. It makes `Runner`s. A runner is one
# executor's prepared resources (Triton's model instance): one prepared batch shape per *bucket*
# (a CUDA graph, or an execution context on its own optimization profile) and one *lane* per
# client (its own CUDA stream and pinned host rows), so that a camera joining costs nothing on
# the device. Everything is prepared and warmed before the daemon says READY; nothing is built
# on a request's path.
#
# Every runner is driven the same way, by the I/O loop (server/executor.py):
#
#     runner = runtime.open_runner(buckets=(1, 2, 4, 8), lanes=64)
#     runner.warm_up()                                  # every bucket, before READY
#     runner.launch([w0, w1, w2], lanes=[5, 0, 17])     # padded into bucket 4; returns at once
#     ...                                               # the loop serves other cameras
#     if runner.done():
#         logits = runner.collect()                     # (3, K) float32
#     runner.close()
#
# `run` is launch, wait and collect in one call: what `stgcnd bench`, validation and the
# backend choice use, so that they measure the path the daemon serves with.
class Runner(ABC):
    """One executor's prepared resources for one model: buckets and client lanes."""

    # True when a batch's compute holds a thread until it is done (see the module docstring):
    # such a runner runs in an InWorker, which wakes the I/O loop once a batch is done
    # (set_waker); else the loop polls `done` on its timer.
    blocking = False

    def __init__(self, info: RuntimeInfo, buckets: Sequence[int], lanes: int) -> None:
        self.info = info
        self.buckets = normalize_buckets(buckets, info.max_batch)
        self.lanes = max(int(lanes), 0)  # 0: no per-client streams (one copy each way)
        self.last_timings: dict[str, float] = {}
        self.compute_ms: dict[int, float] = {}  # bucket -> warmed compute time (ms)
        self.wall_ms: dict[int, float] = {}     # bucket -> warmed launch-to-done time (ms)
        self._t0 = 0.0

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, n: int) -> int:
        """The smallest prepared batch shape that holds n windows."""
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} exceeds the largest bucket {self.buckets[-1]}")

    def launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int]) -> None:
        """Start a batch of n windows (3, T, V, M), one client lane each. The windows may be
        reused as soon as this returns (they are staged)."""
        n = len(windows)
        if not 1 <= n <= self.max_batch or len(lanes) != n:
            raise ValueError(f"launch takes 1..{self.max_batch} windows with one lane each")
        self._t0 = time.perf_counter()
        self._launch(windows, lanes, self.bucket_for(n))

    @abstractmethod
    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None: ...

    def done(self) -> bool:
        """Whether the launched batch has finished (never blocks)."""
        return True

    def wait(self) -> None:  # noqa: B027 - optional hook
        """Block until the launched batch has finished (sleeping, not spinning)."""

    def collect(self) -> np.ndarray:
        """The launched batch's logits (n, K) float32, a copy; sets last_timings. Only once
        `done()` said so or `wait()` returned."""
        out = self._collect()
        self.last_timings.setdefault("total_ms", (time.perf_counter() - self._t0) * 1e3)
        return out

    @abstractmethod
    def _collect(self) -> np.ndarray: ...

    def run(self, windows: Sequence[np.ndarray], lanes: Sequence[int] | None = None
            ) -> np.ndarray:
        """launch, wait, collect: logits (n, K) for n windows."""
        self.launch(windows, lanes if lanes is not None else self._spread(len(windows)))
        self.wait()
        return self.collect()

    def _spread(self, n: int) -> list[int]:
        return [i % self.lanes if self.lanes else 0 for i in range(n)]

    def can_launch(self) -> bool:
        """Whether `launch` would return at once now (False: try again shortly)."""
        return True

    def set_waker(self, wake: Callable[[], None]) -> None:  # noqa: B027 - optional hook
        """How to wake the I/O loop when a batch is done (runners the loop polls ignore it)."""

    def warm_up(self, runs: int = 3) -> dict[int, float]:
        """Run every bucket `runs` (+1) times on realistic data; record each bucket's
        compute and launch-to-done time (the median of the warmed runs) and return the
        compute times: the `expired` estimate, set-up free."""
        _c, t, v, m = self.info.input_shape
        x = synthetic_windows(1, t, m, v, seed=0)[0]
        for b in self._warm_buckets():
            computes, walls = [], []
            for _ in range(runs + 1):
                self.run([x] * b)
                total = float(self.last_timings["total_ms"])
                computes.append(float(self.last_timings.get("compute_ms", total)))
                walls.append(total)
            self.compute_ms[b] = warm_median(computes)
            self.wall_ms[b] = warm_median(walls)
        return dict(self.compute_ms)

    def _warm_buckets(self) -> Sequence[int]:
        return self.buckets

    def attach(self) -> None:  # noqa: B027 - optional hook
        """Make this runner usable from the calling thread (e.g. make the device's context
        current there): called by whichever thread drives it, before its first launch."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free the runner's streams, graphs, contexts and buffers (any thread)."""


class HostRunner(Runner):
    """A blocking runner over a host batch: `compute(batch) -> (logits, compute_ms)` on a
    (n, 3, T, V, M) float32 array. Every batch size is its own bucket: no padding, since a
    CPU's cost grows with every padded window; that cost is linear in the batch, so warm-up
    measures batch 1 and scales it."""

    blocking = True

    def __init__(self, info: RuntimeInfo, compute: Callable[[np.ndarray], tuple[np.ndarray,
                                                                                float]],
                 buckets: Sequence[int], lanes: int) -> None:
        super().__init__(info, buckets, lanes)
        self.buckets = tuple(range(1, self.max_batch + 1))
        self._compute = compute
        self._batch = np.empty((self.max_batch, *info.input_shape), dtype=np.float32)
        self._result: np.ndarray | None = None

    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None:
        n = len(windows)
        for i, w in enumerate(windows):
            np.copyto(self._batch[i], w, casting="same_kind")
        logits, compute_ms = self._compute(self._batch[:n])
        self._result = np.array(logits, dtype=np.float32)  # a copy the caller owns
        self.last_timings = {"compute_ms": compute_ms}

    def _collect(self) -> np.ndarray:
        out, self._result = self._result, None
        assert out is not None
        return out

    def warm_up(self, runs: int = 3) -> dict[int, float]:
        super().warm_up(runs)
        one, wall = self.compute_ms[1], self.wall_ms[1]
        self.compute_ms = {b: b * one for b in self.buckets}
        self.wall_ms = {b: b * wall for b in self.buckets}
        return dict(self.compute_ms)

    def _warm_buckets(self) -> Sequence[int]:
        return (1,)


class InWorker(Runner):
    """A blocking runner driven like a device: its batches run on one worker thread.

    `launch` hands the batch to the worker and returns; the worker runs it, marks it done and
    wakes the I/O loop (the waker writes to the loop's self-pipe). `done` reads a flag."""

    blocking = True

    def __init__(self, inner: Runner, name: str = "") -> None:
        self.inner = inner
        self.info = inner.info
        self.buckets = inner.buckets
        self.lanes = inner.lanes
        self.last_timings: dict[str, float] = {}
        self.compute_ms = inner.compute_ms
        self.wall_ms = inner.wall_ms
        self._t0 = 0.0
        self._wake: Callable[[], None] = _nothing
        # A batch to run, or a call to make on the worker (_in_worker).
        self._work: tuple[Sequence[np.ndarray], Sequence[int]] | Callable[[], object] | None = None
        self._result: np.ndarray | None = None
        self._called: object = None  # what the call returned
        self._error: BaseException | None = None
        self._finished = threading.Event()
        self._finished.set()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=name or f"worker-{inner.info.name}")
        self._thread.start()

    def set_waker(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def warm_up(self, runs: int = 3) -> dict[int, float]:
        # On the worker, where the batches will run (a CUDA context is current there).
        out = self._in_worker(lambda: self.inner.warm_up(runs))
        self.buckets = self.inner.buckets
        self.compute_ms, self.wall_ms = self.inner.compute_ms, self.inner.wall_ms
        return out

    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None:
        # Copies: the caller may reuse its arrays once launch returns (the contract above).
        staged = [np.array(w, dtype=np.float32) for w in windows]
        with self._cond:
            self._finished.clear()
            self._work = (staged, lanes)
            self._cond.notify()

    def done(self) -> bool:
        return self._finished.is_set()

    def wait(self) -> None:
        self._finished.wait()

    def _collect(self) -> np.ndarray:
        error, self._error = self._error, None
        if error is not None:
            raise error
        out, self._result = self._result, None
        assert out is not None
        return out

    def _serve(self) -> None:
        name_os_thread(self._thread.name)  # what top and py-spy show
        self.inner.attach()
        while True:
            with self._cond:
                while self._work is None and not self._closing:
                    self._cond.wait()
                work, self._work = self._work, None
                if self._closing:
                    if work is not None:  # launched, then closed: it ends, with an error
                        self._error = RuntimeError("the runner was closed before this batch ran")
                        self._finished.set()
                    return
            assert work is not None  # not closing: the wait ended on work
            try:
                if callable(work):
                    self._called = work()  # a call to run here (warm-up)
                else:
                    self._result = self.inner.run(*work)
                    self.last_timings = dict(self.inner.last_timings)
            except BaseException as exc:  # answered to the batch's cameras, never lost
                self._error = exc
            self._finished.set()
            self._wake()

    def _in_worker(self, call: Callable[[], _T]) -> _T:
        with self._cond:
            self._finished.clear()
            self._work = call
            self._cond.notify()
        self._finished.wait()
        error, self._error = self._error, None
        if error is not None:
            raise error
        result, self._called = self._called, None
        return cast(_T, result)  # what `call` returned

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        self.inner.close()


def _nothing() -> None:
    pass


class Runtime(ABC):
    """A model loaded into one runtime; a factory of runners."""

    info: RuntimeInfo
    # The class count the loaded artefact itself has (the ONNX graph's output, the engine's
    # output binding, the checkpoint's classifier), set by the runtime when it loads; None
    # where it cannot say, and then the manifest's `info.num_class` stands for it.
    classes: int | None = None

    @property
    def artefact_classes(self) -> int:
        """What the configured labels are checked against (model.spec.check_labels)."""
        return self.classes if self.classes is not None else self.info.num_class

    def open_runner(self, buckets: Sequence[int], lanes: int, name: str = "") -> Runner:
        """One executor's prepared resources, drivable by the I/O loop (blocking runners
        come wrapped in an InWorker, whose thread is called `name`)."""
        runner = self._open_runner(buckets, lanes)
        return InWorker(runner, name) if runner.blocking else runner

    @abstractmethod
    def _open_runner(self, buckets: Sequence[int], lanes: int) -> Runner: ...

    def runner_bytes(self, buckets: Sequence[int]) -> int:
        """Device memory one runner with these buckets would take (activations, graphs,
        input and output buffers), for the daemon's memory plan; 0 for host runtimes."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free what the runtime holds (engine, weights); its runners are closed first."""

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
