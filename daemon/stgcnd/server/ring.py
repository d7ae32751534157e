"""Per-camera ring buffer of single frames: push mode's server-side window."""

from __future__ import annotations

import numpy as np

FIRST_CAPACITY = 8  # frames; the buffer doubles up to the window as frames arrive


class FrameRing:
    """The last T frames (3, V, M) of one camera for one model, as a window (3, T, V, M).

    A prediction is due when the frame that fills the window arrives, then every `stride`
    frames. Frames before the window is full give no prediction (a zero-padded window would be
    a different input than the model was trained on).

    The buffer starts small and doubles while the window fills, so that a camera that sent a
    few frames holds kilobytes, not a whole window (59 KB per person at 150 frames).
    """

    def __init__(self, window_shape: tuple[int, int, int, int], stride: int = 1) -> None:
        c, t, v, m = window_shape
        self.shape = (c, t, v, m)
        self.frames = t
        self.stride = stride
        self._buf = np.zeros((min(FIRST_CAPACITY, t), c, v, m), dtype=np.float32)
        self.received = 0  # frames appended since creation or the last reset

    def append(self, frame: np.ndarray) -> bool:
        """Store one frame (3, V, M); True if a prediction is due for it."""
        received = self.received
        buf = self._buf
        if received == len(buf) < self.frames:  # still filling: grow, frames stay in order
            grown = np.empty((min(2 * len(buf), self.frames), *buf.shape[1:]), np.float32)
            grown[:received] = buf
            self._buf = buf = grown
        buf[received % self.frames] = frame
        self.received = received = received + 1
        if received < self.frames:
            return False
        return (received - self.frames) % self.stride == 0

    @property
    def buffered(self) -> int:
        return min(self.received, self.frames)

    @property
    def nbytes(self) -> int:
        return self._buf.nbytes

    def window(self) -> np.ndarray:
        """The last T frames, oldest first, as a contiguous (3, T, V, M) float32 window;
        only once the window is full (`append` said a prediction is due)."""
        if self.received < self.frames:
            raise ValueError(f"the window holds {self.received} of {self.frames} frames")
        start = self.received % self.frames
        ordered = np.concatenate((self._buf[start:], self._buf[:start])) if start else self._buf
        return np.ascontiguousarray(ordered.transpose(1, 0, 2, 3))

    def reset(self) -> None:
        self._buf = np.zeros((min(FIRST_CAPACITY, self.frames), *self._buf.shape[1:]),
                             np.float32)
        self.received = 0
