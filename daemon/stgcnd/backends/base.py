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
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
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


class Backend(ABC):
    """A model loaded into one runtime; a factory of sessions."""

    info: BackendInfo

    @abstractmethod
    def open_session(self) -> Session: ...

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
