"""The array a call sends: its dtype made wire-ready, its layout checked before sending.

Skeleton data usually comes out of a pose estimator as (V, 3) per person, or (T, V, C) for a
clip: the order of a landmark list, not the channel-first order the models take. Such an
array is refused here with the transpose that fixes it, rather than with a bare shape
mismatch (or a server's `bad-shape`) that leaves the reader to work out the axes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

CHANNELS = 3  # (x, y, visibility): every model's first axis (docs/protocol.md, §2)

WINDOW = "(3, T, V, M)"
FRAME = "(3, V, M)"
_SKELETON_WINDOW = ("SkeletonWindow(frames=T, persons=M) builds both from a pose estimator's "
                    "people: .frame(people) for push(), .window() for infer()")


def as_window(value: object) -> np.ndarray:
    """A window for `infer`: (3, T, V, M), float32 or float16 (other numbers converted)."""
    return _as_payload(value, 4, "window", WINDOW, _window_hint)


def as_frame(value: object) -> np.ndarray:
    """A frame for `push`: (3, V, M), float32 or float16 (other numbers converted)."""
    return _as_payload(value, 3, "frame", FRAME, _frame_hint)


def _as_payload(value: object, ndim: int, what: str, shape: str,
                hint: Callable[[tuple[int, ...]], str]) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype not in (np.float32, np.float16):
        if array.dtype.kind not in "fiub":
            raise TypeError(f"{what} must be numeric (float32 preferred), got {array.dtype}")
        # float64 is what numpy makes by default; the wire carries float32.
        array = array.astype(np.float32)
    if array.ndim != ndim or array.shape[0] != CHANNELS:
        raise ValueError(f"{what} must have shape {shape}, got {array.shape}"
                         + hint(array.shape))
    return array


def _window_hint(shape: tuple[int, ...]) -> str:
    if len(shape) == 3 and shape[-1] == CHANNELS:
        return (f": that looks like (T, V, C), frames x keypoints x (x, y, visibility); "
                f"window.transpose(2, 0, 1)[..., None] makes {WINDOW} of one person, or "
                f"{_SKELETON_WINDOW}")
    if len(shape) == 3 and shape[0] == CHANNELS:
        return (f": a frame {FRAME} goes to push(); a window of one person without its "
                f"person axis takes window[..., None]")
    if len(shape) == 4 and shape[-1] == CHANNELS:
        return (f": that looks like (M, T, V, C); window.transpose(3, 1, 2, 0) makes {WINDOW}, "
                f"or {_SKELETON_WINDOW}")
    if len(shape) == 4 and shape[2] == CHANNELS:
        return (f": that looks like (T, V, C, M); window.transpose(2, 0, 1, 3) makes {WINDOW}, "
                f"or {_SKELETON_WINDOW}")
    if len(shape) == 5 and shape[0] == 1:
        return ": one window per call; pass window[0]"
    return f"; the first axis holds the {CHANNELS} channels (x, y, visibility)"


def _frame_hint(shape: tuple[int, ...]) -> str:
    if len(shape) == 2 and shape[-1] == CHANNELS:
        return (f": that looks like one person's pose (V, 3) of (x, y, visibility); "
                f"pose.T[:, :, None] makes {FRAME} of one person, or {_SKELETON_WINDOW}")
    if len(shape) == 2 and shape[0] == CHANNELS:
        return ": one person's frame without its person axis takes frame[:, :, None]"
    if len(shape) == 3 and shape[-1] == CHANNELS:
        return (f": that looks like (M, V, C), people x keypoints x (x, y, visibility); "
                f"frame.transpose(2, 1, 0) makes {FRAME}, or {_SKELETON_WINDOW}")
    if len(shape) == 4:
        return f": a whole window {WINDOW} goes to infer(); push() takes one frame"
    return f"; the first axis holds the {CHANNELS} channels (x, y, visibility)"

