from __future__ import annotations

import numpy as np

from stgcnd.server.ring import FrameRing


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
