"""The I/O loop's wake-up timer: a real timerfd, polled with ZeroMQ's poller as the loop does."""

from __future__ import annotations

import time

import pytest
import zmq

from stgcnd.server.wakeup import WakeTimer


@pytest.fixture
def timer():
    t = WakeTimer()
    if t.fd is None:
        pytest.skip("no timerfd on this system (the loop falls back to millisecond timeouts)")
    yield t
    t.close()


def _fired(t: WakeTimer, wait_ms: int) -> bool:
    poller = zmq.Poller()
    poller.register(t.fd, zmq.POLLIN)
    return bool(dict(poller.poll(wait_ms)))


def test_fires_at_the_armed_time_and_not_before(timer):
    at = time.monotonic() + 0.05
    timer.arm(at)
    assert not _fired(timer, 0), "fired 50 ms early"
    assert _fired(timer, 2000), "never fired"
    assert time.monotonic() >= at
    timer.clear()
    assert timer.armed_at is None
    assert not _fired(timer, 0), "clear() did not consume the firing"


def test_a_time_already_passed_fires_at_once(timer):
    timer.arm(time.monotonic() - 1.0)
    assert _fired(timer, 1000)
    timer.clear()


def test_rearming_replaces_and_disarm_cancels(timer):
    timer.arm(time.monotonic() + 0.02)
    timer.arm(time.monotonic() + 10.0)  # replaces the earlier time
    assert not _fired(timer, 60)
    timer.arm(time.monotonic() + 0.02)
    timer.disarm()
    assert timer.armed_at is None
    assert not _fired(timer, 60)


def test_an_absurd_time_is_clamped_not_an_error(timer):
    """A runaway estimate (1e12 s away) once overflowed timespec and timerfd_settime's EINVAL
    took the daemon down; it arms at most an hour ahead instead."""
    timer.arm(time.monotonic() + 1e12)
    assert not _fired(timer, 20)
    timer.disarm()
