"""Bad inputs a camera process gets wrong first (issue #32, item 9): each is refused before
anything is sent, with what to write instead, not with a raw ZMQError or a bare shape."""

from __future__ import annotations

import re

import numpy as np
import pytest

from stgcnd_client import Client, Events, SkeletonWindow

T, V = 30, 33


@pytest.mark.parametrize(("endpoint", "says"), [
    ("http://10.0.0.5:5555", "stgcnd speaks ZeroMQ, not HTTP; use tcp://10.0.0.5:5555"),
    ("https://camera-box/stgcnd", "not HTTPS; use tcp://camera-box:5555"),
    ("tcp://10.0.0.5", "the port is missing: tcp://10.0.0.5:5555"),
    ("tcp://10.0.0.5:", "expected tcp://HOST:PORT"),
    ("tcp://*:5555", "connect to the daemon's address"),
    ("localhost:5555", "did you mean tcp://localhost:5555?"),
])
def test_a_wrong_endpoint_is_refused_when_the_client_is_made(endpoint, says):
    for make in (Client, Events):
        with pytest.raises(ValueError, match=re.escape(says)):
            make(endpoint)


def test_good_endpoints_are_taken():
    for endpoint in ("tcp://127.0.0.1:5555", "tcp://[::1]:5555", "tcp://door-box.local:5555",
                     "ipc:///run/stgcnd/stgcnd.sock", "ipc://@stgcnd"):
        Client(endpoint).close()


@pytest.mark.parametrize(("call", "array", "says"), [
    ("infer", np.zeros((T, V, 3)), r"\(T, V, C\).*window\.transpose\(2, 0, 1\)\[\.\.\., None\]"
                                   r".*SkeletonWindow"),
    ("infer", np.zeros((T, V, 3, 1)), r"\(T, V, C, M\).*transpose\(2, 0, 1, 3\)"),
    ("infer", np.zeros((1, 3, T, V, 1)), r"one window per call; pass window\[0\]"),
    ("infer", np.zeros((3, V, 1)), r"a frame \(3, V, M\) goes to push\(\)"),
    ("push", np.zeros((V, 3)), r"one person's pose \(V, 3\).*pose\.T\[:, :, None\]"
                               r".*SkeletonWindow"),
    ("push", np.zeros((2, V, 3)), r"\(M, V, C\).*frame\.transpose\(2, 1, 0\)"),
    ("push", np.zeros((3, T, V, 1)), r"a whole window \(3, T, V, M\) goes to infer\(\)"),
])
def test_a_skeleton_in_another_layout_gets_the_transpose_that_fixes_it(call, array, says):
    with Client("ipc:///nonexistent/stgcnd.sock") as client, \
            pytest.raises(ValueError, match=says):
        getattr(client, call)(array)


def test_the_hinted_transposes_give_what_skeleton_window_gives():
    """The fixes the messages name are right: they make what SkeletonWindow makes."""
    rng = np.random.default_rng(1)
    poses = rng.uniform(0.2, 0.8, size=(T, V, 3)).astype(np.float32)  # (T, V, C)
    win = SkeletonWindow(frames=T, persons=1)
    frames = [win.frame([pose]) for pose in poses]
    np.testing.assert_array_equal(poses[-1].T[:, :, None], frames[-1])
    np.testing.assert_array_equal(poses.transpose(2, 0, 1)[..., None], win.window())
