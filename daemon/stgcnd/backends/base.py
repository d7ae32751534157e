"""The backend contract shared by every runtime (TensorRT, PyTorch, ONNX Runtime).

Modelled on Polygraphy's loader/runner split: a `Backend` is loaded once per model in the
daemon's process (it owns the weights / engine and, for CUDA, uses the process's one context);
it opens any number of `Session`s. A session is one client's private execution state: its own
CUDA stream, execution context and pinned host / device buffers. A session is used by one
thread at a time, runs concurrently with other sessions, and is closed explicitly.

    backend = open_backend(spec, "auto", "fp16", store)      # stgcnd.backends.registry
    with backend.open_session() as s:
        logits = s.infer(batch)            # (B, 3, T, V, M) float32/float16 -> (B, K) float32
        s.last_timings                     # {"h2d_ms", "compute_ms", "d2h_ms", "total_ms"}
    backend.close()

The daemon's executors use the batched form instead (Triton's model instance): a `BatchRunner`
is one executor's device resources, made and warmed before READY and then used by that one
thread only. It holds one prepared batch shape per *bucket* (a CUDA graph, or an execution
context on its own optimization profile) and one *lane* per client (its own CUDA stream and
pinned host rows), so that a camera joining costs nothing on the device:

    runner = backend.open_runner(buckets=(1, 2, 4, 8), lanes=64)   # in the executor thread
    runner.warm_up()                               # every bucket, before READY
    logits = runner.run([w0, w1, w2], lanes=[5, 0, 17])   # (3, K): padded into bucket 4
    runner.last_timings                            # {"compute_ms", "total_ms", "bucket"}
    runner.close()                                 # in the same thread
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stgcnd.errors import UserError


@dataclass(frozen=True)
class BackendInfo:
    """What a loaded backend is, for logs, `hello` replies and bench tables."""

    name: str                       # "tensorrt", "torch", "onnxruntime"
    precision: str                  # "fp32", "fp16", "int8"
    device: str                     # "cpu", "cuda:0", ...
    input_shape: tuple[int, ...]    # one window (3, T, V, M)
    num_class: int
    max_batch: int                  # largest batch a session accepts
    artifact: str | None = None     # path of the artefact it runs
    details: dict[str, Any] = field(default_factory=dict)


class Session(ABC):
    """One client's execution state. Not thread-safe: one thread at a time (checked)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.last_timings: dict[str, float] = {}
        self._closed = False
        self._busy = threading.Lock()

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Logits (B, num_class) float32 for windows (B, 3, T, V, M) float32 or float16."""
        if self._closed:
            raise RuntimeError("session is closed")
        batch = self.backend.check_batch(batch)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("a session is used by one thread at a time; open one per thread")
        try:
            t0 = time.perf_counter()
            out = self._infer(batch)
            self.last_timings.setdefault("total_ms", (time.perf_counter() - t0) * 1e3)
            return out
        finally:
            self._busy.release()

    @abstractmethod
    def _infer(self, batch: np.ndarray) -> np.ndarray:
        """Run one batch; set self.last_timings (h2d_ms, compute_ms, d2h_ms, total_ms)."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release()

    def _release(self) -> None:  # noqa: B027 - optional hook
        """Free the session's stream, context and buffers."""

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BatchRunner:
    """One executor's prepared device resources for one model: buckets and client lanes.

    Created, used and closed by one thread (the executor's): pycuda and CUDA-graph objects must
    not be made in one thread and collected in another. Nothing is built on `run`: every bucket
    is prepared in the constructor or `warm_up`, every lane in the constructor.
    """

    def __init__(self, backend: Backend, buckets: Sequence[int], lanes: int) -> None:
        self.backend = backend
        self.buckets = normalize_buckets(buckets, backend.info.max_batch)
        # Client lanes (their own CUDA streams); 0 = none: a batch moves in one copy each way.
        self.lanes = max(int(lanes), 0)
        self.last_timings: dict[str, float] = {}
        self.compute_ms: dict[int, float] = {}   # bucket -> warmed-up compute time estimate
        # bucket -> warmed-up launch-to-finish time (host staging and copies included): when
        # the I/O loop first looks whether a batch it launched is done
        self.wall_ms: dict[int, float] = {}

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, n: int) -> int:
        """The smallest prepared batch shape that holds n windows."""
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} exceeds the largest bucket {self.buckets[-1]}")

    # True when `launch` only enqueues device work and returns in microseconds, so that the
    # I/O loop itself may drive this runner (launch, then poll `done` on a timer) with no
    # executor thread between it and the device: two thread hand-offs fewer per request.
    # False for runners that compute on the calling thread (CPU runtimes): an executor thread
    # runs them, or every camera would wait for each batch's compute.
    nonblocking = False

    def run(self, windows: Sequence[np.ndarray], lanes: Sequence[int]) -> np.ndarray:
        """Logits (n, K) float32 (a copy) for n windows (3, T, V, M), one per client lane."""
        self.launch(windows, lanes)
        self.wait()
        return self.collect()

    def launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int]) -> None:
        """Start a batch of n windows (one lane each); `collect` returns its logits once
        `done`. The windows may be reused as soon as this returns (they are staged)."""
        n = len(windows)
        if not 1 <= n <= self.max_batch or len(lanes) != n:
            raise ValueError(f"run takes 1..{self.max_batch} windows with one lane each")
        self._t0 = time.perf_counter()
        self._n = n
        self._launch(windows, lanes, self.bucket_for(n))

    def can_launch(self) -> bool:
        """Whether `launch` would return at once now (False: try again shortly)."""
        return True

    def done(self) -> bool:
        """Whether the launched batch has finished (never blocks)."""
        return True

    def wait(self) -> None:
        """Block until the launched batch has finished (sleeping, not spinning)."""

    def collect(self) -> np.ndarray:
        """The launched batch's logits (n, K) float32, a copy; sets last_timings. Only once
        `done()` said so or `wait()` returned."""
        out = self._collect()
        self.last_timings.setdefault("total_ms", (time.perf_counter() - self._t0) * 1e3)
        return out

    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None:
        # Runners that compute on the calling thread finish within launch.
        self._result = self._run(windows, lanes, bucket)

    def _collect(self) -> np.ndarray:
        out, self._result = self._result, None
        return out

    def _run(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
             ) -> np.ndarray:
        """Run n windows padded to `bucket`; set self.last_timings (compute_ms, total_ms).
        Synchronous runners implement this; non-blocking ones `_launch`, `done`, `wait` and
        `_collect` instead."""
        raise NotImplementedError

    def warm_up(self, runs: int = 3) -> dict[int, float]:
        """Run every bucket `runs` times on realistic data; record and return each bucket's
        compute time (ms, the median of the warmed runs): the deadline estimate, set-up free."""
        from stgcnd.model.synthetic import synthetic_windows

        _c, t, v, m = self.backend.info.input_shape
        x = synthetic_windows(1, t, m, v, seed=0)[0]
        for b in self.buckets:
            computes, walls = zip(*(self._timed_run([x] * b) for _ in range(runs + 1)))
            self.compute_ms[b] = _warm_median(list(computes))
            self.wall_ms[b] = _warm_median(list(walls))
        return dict(self.compute_ms)

    def _timed_run(self, windows: list[np.ndarray]) -> tuple[float, float]:
        """(compute ms, launch-to-finish ms) of one run."""
        self.run(windows, [i % self.lanes if self.lanes else 0 for i in range(len(windows))])
        total = float(self.last_timings["total_ms"])
        return float(self.last_timings.get("compute_ms", total)), total

    def attach(self) -> None:
        """Make this runner usable from the calling thread (the I/O loop, for non-blocking
        runners made by another thread): e.g. make the device's context current there."""

    def detach(self) -> None:
        """Undo `attach` in the calling thread without touching the device: for a runner
        abandoned after a device error, which is never closed."""

    def close(self) -> None:
        """Free the runner's streams, graphs, contexts and buffers (in the owning thread)."""


class SessionRunner(BatchRunner):
    """The generic runner for CPU backends: one session, windows stacked into one host batch.

    CPU runtimes have no streams to give a client, so lanes are only indices here. Every batch
    size is its own bucket (no padding: a CPU's cost grows with every padded window), and a
    CPU's cost is linear in the batch, so warm-up measures batch 1 and scales it.
    """

    def __init__(self, backend: Backend, buckets: Sequence[int], lanes: int) -> None:
        super().__init__(backend, buckets, lanes)
        self.buckets = tuple(range(1, self.max_batch + 1))
        self.session = backend.open_session()
        self.batch = np.empty((self.max_batch, *backend.info.input_shape), dtype=np.float32)

    def warm_up(self, runs: int = 3) -> dict[int, float]:
        from stgcnd.model.synthetic import synthetic_windows

        _c, t, v, m = self.backend.info.input_shape
        x = synthetic_windows(1, t, m, v, seed=0)[0]
        computes, walls = zip(*(self._timed_run([x]) for _ in range(runs + 1)))
        one, wall = _warm_median(list(computes)), _warm_median(list(walls))
        self.compute_ms = {b: b * one for b in self.buckets}
        self.wall_ms = {b: b * wall for b in self.buckets}
        return dict(self.compute_ms)

    def _run(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
             ) -> np.ndarray:
        out = np.array(infer_stacked(self.session, self.batch, windows), dtype=np.float32)
        self.last_timings = dict(self.session.last_timings)
        return out

    def close(self) -> None:
        self.session.close()


def infer_stacked(session: Session, staging: np.ndarray, windows: Sequence[np.ndarray]
                  ) -> np.ndarray:
    """A session's logits for windows stacked into the first rows of `staging`."""
    for i, w in enumerate(windows):
        np.copyto(staging[i], w, casting="same_kind")
    return session.infer(staging[:len(windows)])


def _warm_median(times: list[float]) -> float:
    """The median run time, leaving out the first run (it pays lazy set-up) when there are
    others."""
    warm = sorted(times[1:] or times)
    return warm[len(warm) // 2]


def normalize_buckets(buckets: Sequence[int], max_batch: int) -> tuple[int, ...]:
    """Sorted unique bucket sizes within 1..max_batch, always including 1 and the largest
    size allowed (so that every batch the scheduler may form has a bucket)."""
    top = max(1, min(max(buckets, default=1), max_batch))
    return tuple(sorted({1, top, *(b for b in buckets if 1 <= b <= top)}))


class Backend(ABC):
    """A model loaded into one runtime; a factory of sessions and batch runners."""

    info: BackendInfo

    @abstractmethod
    def open_session(self) -> Session: ...

    @property
    def nonblocking_runners(self) -> bool:
        """Whether open_runner gives runners whose launch only enqueues device work
        (BatchRunner.nonblocking): the I/O loop may then drive them (dispatch "auto")."""
        return False

    def open_runner(self, buckets: Sequence[int], lanes: int) -> BatchRunner:
        """One executor's device resources; call from the executor thread that will use it."""
        return SessionRunner(self, buckets, lanes)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free what the backend holds (engine, weights). Sessions must be closed first."""

    def check_batch(self, batch: np.ndarray) -> np.ndarray:
        """Validate a batch's shape and dtype; float16 is accepted and widened if needed."""
        if not isinstance(batch, np.ndarray):
            raise TypeError(f"expected a numpy array, got {type(batch).__name__}")
        if batch.dtype not in (np.float32, np.float16):
            raise UserError(f"windows must be float32 or float16, got {batch.dtype}")
        want = self.info.input_shape
        if batch.ndim != len(want) + 1 or tuple(batch.shape[1:]) != tuple(want):
            raise UserError(f"expected windows of shape (B, {', '.join(map(str, want))}), got "
                            f"{tuple(batch.shape)}")
        if not 1 <= batch.shape[0] <= self.info.max_batch:
            raise UserError(f"batch size {batch.shape[0]} outside 1..{self.info.max_batch}")
        return np.ascontiguousarray(batch)

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
