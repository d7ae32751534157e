from __future__ import annotations

import numpy as np

from stgcnd.server.cameras import FrameRing


def test_window_is_the_last_t_frames_oldest_first():
    ring = FrameRing((3, 4, 2, 1), stride=2)
    frames = [np.full((3, 2, 1), i, np.float32) for i in range(9)]
    due = [ring.append(f) for f in frames]
    assert due == [False, False, False, True, False, True, False, True, False]
    w = ring.window()
    assert w.shape == (3, 4, 2, 1)
    assert [int(w[0, t, 0, 0]) for t in range(4)] == [5, 6, 7, 8]
    ring.reset()
    assert ring.buffered == 0 and not ring.append(frames[0])


def test_the_ring_grows_with_the_frames_a_camera_sent():
    shape = (3, 150, 33, 5)
    ring = FrameRing(shape, stride=10)
    frames = [np.full((3, 33, 5), i, np.float32) for i in range(160)]
    for f in frames[:3]:
        ring.append(f)
    assert ring.nbytes <= 8 * 3 * 33 * 5 * 4  # a few frames cost kilobytes, not a window
    due = [ring.append(f) for f in frames[3:]]
    assert ring.nbytes == 150 * 3 * 33 * 5 * 4
    assert [i + 3 for i, d in enumerate(due) if d] == [149, 159]
    w = ring.window()
    assert [int(w[0, t, 0, 0]) for t in (0, 1, 149)] == [10, 11, 159]
    ring.reset()
    assert ring.nbytes <= 8 * 3 * 33 * 5 * 4 and ring.buffered == 0
