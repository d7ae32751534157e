"""Per-camera ring buffer of single frames: push mode's server-side window."""

from __future__ import annotations

import numpy as np


class FrameRing:
    """The last T frames (3, V, M) of one camera for one model, as a window (3, T, V, M).

    A prediction is due when the frame that fills the window arrives, then every `stride`
    frames. Frames before the window is full give no prediction (a zero-padded window would be
    a different input than the model was trained on).
    """

    def __init__(self, window_shape: tuple[int, int, int, int], stride: int = 1) -> None:
        c, t, v, m = window_shape
        self.shape = (c, t, v, m)
        self.frames = t
        self.stride = stride
        self._buf = np.zeros((t, c, v, m), dtype=np.float32)
        self.received = 0  # frames appended since creation or the last reset

    def append(self, frame: np.ndarray) -> bool:
        """Store one frame (3, V, M); True if a prediction is due for it."""
        self._buf[self.received % self.frames] = frame
        self.received += 1
        if self.received < self.frames:
            return False
        return (self.received - self.frames) % self.stride == 0

    @property
    def buffered(self) -> int:
        return min(self.received, self.frames)

    def window(self) -> np.ndarray:
        """The buffered frames, oldest first, as a contiguous (3, T, V, M) float32 window."""
        start = self.received % self.frames
        ordered = np.concatenate((self._buf[start:], self._buf[:start])) if start else self._buf
        return np.ascontiguousarray(ordered.transpose(1, 0, 2, 3))

    def reset(self) -> None:
        self._buf[:] = 0
        self.received = 0
