"""The `noop` runtime: copies each window in and returns zero logits (Triton's identity model).

It measures the daemon itself: with the network's compute taken out, what remains is
decoding, queueing, scheduling and replying. It needs no torch, artefact or store, is never
chosen by "auto", and `compute_us` (`noop_compute_us`) makes each batch take that long.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from stgcnd.log import get_logger
from stgcnd.model.reference import checkpoint_num_class
from stgcnd.model.spec import ModelSpec
from stgcnd.runtimes.base import Runner, Runtime, RuntimeInfo

log = get_logger(__name__)


# It needs no torch, no artefact and no engine store; the model spec alone gives its shape:
# - input_shape: the spec's (3, frames, joints, persons);
# - num_class: the number of `labels` configured, else, when the spec names a checkpoint and torch
#   is importable, the checkpoint's (one state_dict read, no network built; labels go first so
#   that a configured model never pays for importing torch), else the spec's own num_class (2,
#   the demo model's).
def noop_num_class(spec: ModelSpec) -> tuple[int, str]:
    """(num_class, where it came from) for a model spec; see the comment above."""
    if spec.labels:
        return len(spec.labels), "labels"
    from_checkpoint = checkpoint_num_class(spec)
    if from_checkpoint is not None:
        return from_checkpoint, "checkpoint"
    return int(spec.num_class), "spec"


# `compute_us` (the model key `noop_compute_us`) makes every batch finish that long after it
# starts, whatever its size, as a GPU's would: the daemon's scheduling, batching and completion
# timing can then be measured and tested on any machine at a realistic device time. Runners read
# it at every launch, so a test can make one batch slow (as CPU contention makes one) by setting
# the runtime's `compute_us` while it serves.
class NoopRuntime(Runtime):
    def __init__(self, input_shape: tuple[int, ...], num_class: int, max_batch: int = 1,
                 precision: str = "fp32", details: dict[str, object] | None = None,
                 compute_us: int = 0) -> None:
        if num_class < 1:
            raise ValueError(f"num_class must be >= 1, got {num_class}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.compute_us = compute_us  # each batch's simulated device time
        # Always the CPU: the noop touches no device, whatever the model's `device` says.
        self.info = RuntimeInfo(
            name="noop", precision=precision, device="cpu", input_shape=tuple(input_shape),
            num_class=int(num_class), max_batch=int(max_batch), artifact=None,
            details=dict(details or {}))
        log.info("backend_loaded", backend="noop", input_shape=list(self.info.input_shape),
                 num_class=self.info.num_class, max_batch=self.info.max_batch)

    @classmethod
    def from_spec(cls, spec: ModelSpec, max_batch: int = 1, precision: str = "fp32",
                  compute_us: int = 0) -> NoopRuntime:
        num_class, source = noop_num_class(spec)
        return cls(tuple(spec.input_shape), num_class, max_batch, precision,
                   details={"num_class_from": source}, compute_us=compute_us)

    def _open_runner(self, buckets: Sequence[int], lanes: int) -> Runner:
        return NoopRunner(self, buckets, lanes)


class NoopRunner(Runner):
    """The batch copied into a staging buffer; finished `compute_us` after its launch.

    Non-blocking like a GPU runner (the copy takes microseconds), so the I/O loop polls it,
    timer and all, on machines without a GPU."""

    def __init__(self, runtime: NoopRuntime, buckets: Sequence[int], lanes: int) -> None:
        super().__init__(runtime.info, buckets, lanes)
        info = runtime.info
        self._staging = np.empty((self.max_batch, *info.input_shape), dtype=np.float32)
        self._zeros = np.zeros((self.max_batch, info.num_class), dtype=np.float32)
        self._runtime = runtime
        self._compute_s = 0.0  # the batch in flight's device time
        self._ready_at = 0.0
        self._n = 0
        self._copy_ms = 0.0

    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None:
        t0 = time.perf_counter()
        for i, w in enumerate(windows):  # the copy is the work, widening float16 on the way
            np.copyto(self._staging[i], w, casting="same_kind")
        self._n = len(windows)
        now = time.perf_counter()
        self._copy_ms = (now - t0) * 1e3
        self._compute_s = max(int(self._runtime.compute_us), 0) / 1e6
        self._ready_at = now + self._compute_s

    def done(self) -> bool:
        return time.perf_counter() >= self._ready_at

    def wait(self) -> None:
        left = self._ready_at - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def _collect(self) -> np.ndarray:
        self.last_timings = {"compute_ms": self._copy_ms + self._compute_s * 1e3}
        return self._zeros[:self._n].copy()  # the caller owns its result; zeros stay zero
