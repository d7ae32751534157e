"""The `noop` backend: copies each window in and returns zero logits (Triton's identity model).

It exists to measure the daemon itself: with the network's compute taken out, what remains in a
request's round trip is decoding, queueing, scheduling and replying. So that the one real cost
of an inference that does not depend on the network stays in, each session copies the batch
into its own preallocated buffer (the host-side staging every real backend does).

It needs no torch, no artefact and no engine store; the model spec alone gives its shape:
- input_shape: the spec's (3, frames, joints, persons);
- num_class: the number of `labels` configured, else, when the spec names a checkpoint and torch
  is importable, the checkpoint's (one state_dict read, no network built; labels go first so
  that a configured model never pays for importing torch), else the spec's own num_class (2,
  the demo model's).

It is never chosen by backend "auto": it computes nothing and only serves to benchmark.

`compute_us` (the model key `noop_compute_us`) makes every batch finish that long after it
starts, whatever its size, as a GPU's would: the daemon's scheduling, batching and completion
timing can then be measured and tested on any machine at a realistic device time.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from stgcnd.backends.base import Backend, BackendInfo, BatchRunner, Session, infer_stacked
from stgcnd.log import get_logger

log = get_logger(__name__)


def _checkpoint_num_class(spec: Any) -> int | None:
    """The checkpoint's class count, or None when there is no checkpoint or no torch to read it.

    A checkpoint that cannot be read is an error (CheckpointError says why), as with the real
    backends: serving a noop with a different class count than the model would mislead clients.
    """
    if spec.checkpoint is None or importlib.util.find_spec("torch") is None:
        return None
    from stgcnd.model.checkpoint import inspect_state_dict, read_state_dict

    state = read_state_dict(spec.checkpoint)
    return inspect_state_dict(state, str(spec.checkpoint)).num_class


def noop_num_class(spec: Any) -> tuple[int, str]:
    """(num_class, where it came from) for a model spec; see the module docstring."""
    if spec.labels:
        return len(spec.labels), "labels"
    from_checkpoint = _checkpoint_num_class(spec)
    if from_checkpoint is not None:
        return from_checkpoint, "checkpoint"
    return int(spec.num_class), "spec"


class NoopBackend(Backend):
    def __init__(self, input_shape: tuple[int, ...], num_class: int, max_batch: int = 1,
                 precision: str = "fp32", details: dict[str, Any] | None = None) -> None:
        if num_class < 1:
            raise ValueError(f"num_class must be >= 1, got {num_class}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        # Always the CPU: the noop touches no device, whatever the model's `device` says.
        self.info = BackendInfo(
            name="noop", precision=precision, device="cpu", input_shape=tuple(input_shape),
            num_class=int(num_class), max_batch=int(max_batch), artifact=None,
            details=dict(details or {}))
        log.info("backend_loaded", backend="noop", input_shape=list(self.info.input_shape),
                 num_class=self.info.num_class, max_batch=self.info.max_batch)

    @classmethod
    def from_spec(cls, spec: Any, max_batch: int = 1, precision: str = "fp32") -> NoopBackend:
        num_class, source = noop_num_class(spec)
        return cls(tuple(spec.input_shape), num_class, max_batch, precision,
                   details={"num_class_from": source})

    compute_us = 0  # each batch's simulated device time (see the module docstring)

    def open_session(self) -> Session:
        return _NoopSession(self)

    @property
    def nonblocking_runners(self) -> bool:
        return True

    def open_runner(self, buckets: Sequence[int], lanes: int) -> BatchRunner:
        return _NoopRunner(self, buckets, lanes)


class _NoopRunner(BatchRunner):
    """The batch copied in by one session; finished `compute_us` after its launch.

    Non-blocking like a GPU runner (the copy takes microseconds), so the I/O loop drives it
    and the daemon's loop-driven path runs, timer and all, on machines without a GPU."""

    nonblocking = True
    backend: NoopBackend

    def __init__(self, backend: NoopBackend, buckets: Sequence[int], lanes: int) -> None:
        super().__init__(backend, buckets, lanes)
        self.session = backend.open_session()
        self.batch = np.empty((self.max_batch, *backend.info.input_shape), dtype=np.float32)
        self._compute_s = max(int(backend.compute_us), 0) / 1e6
        self._ready_at = 0.0

    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None:
        self._result = infer_stacked(self.session, self.batch, windows)
        self._ready_at = time.perf_counter() + self._compute_s

    def done(self) -> bool:
        return time.perf_counter() >= self._ready_at

    def wait(self) -> None:
        left = self._ready_at - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def _collect(self) -> np.ndarray:
        ms = float(self.session.last_timings["compute_ms"]) + self._compute_s * 1e3
        self.last_timings = {"compute_ms": ms}
        return super()._collect()

    def close(self) -> None:
        self.session.close()


class _NoopSession(Session):
    backend: NoopBackend

    def __init__(self, backend: NoopBackend) -> None:
        super().__init__(backend)
        info = backend.info
        # Preallocated once per session, like a real session's pinned staging buffer.
        self._staging = np.empty((info.max_batch, *info.input_shape), dtype=np.float32)
        self._zeros = np.zeros((info.max_batch, info.num_class), dtype=np.float32)

    def _infer(self, batch: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        n = batch.shape[0]
        # The copy is the work: float16 windows are widened on the way in, as others do.
        np.copyto(self._staging[:n], batch, casting="same_kind")
        out = self._zeros[:n].copy()  # the caller owns its result; the buffer stays zero
        ms = (time.perf_counter() - t0) * 1e3
        self.last_timings = {"compute_ms": ms, "total_ms": ms}
        return out

    def _release(self) -> None:
        self._staging = np.empty((0,), dtype=np.float32)
        self._zeros = np.empty((0,), dtype=np.float32)
