"""A wake-up timer the I/O loop can poll next to its sockets: a Linux timerfd.

The loop drives non-blocking runners itself (stgcnd.server.loop_executor): it launches a batch
and must look again when the device should be done, typically 0.1-10 ms later. ZeroMQ's poll
timeout counts whole milliseconds, too coarse for a 0.6 ms batch; a timerfd armed at an absolute
CLOCK_MONOTONIC time (the clock of time.monotonic on Linux) wakes poll within microseconds of
the deadline, with no thread to hand the news over.

os.timerfd_create exists only from Python 3.13, and the daemon runs on 3.8 (JetPack 5): the
three libc calls are made through ctypes. Where they are missing (not Linux), `fd` is None and
the loop falls back to poll timeouts rounded up to whole milliseconds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from typing import Any

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int,
                                         ctypes.POINTER(_Itimerspec),
                                         ctypes.POINTER(_Itimerspec)]
        return libc
    except (OSError, AttributeError):
        return None


MAX_ARM_S = 3600.0


class WakeTimer:
    """One-shot timer at an absolute monotonic time; `fd` becomes readable when it fires."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.armed_at: float | None = None   # when the caller wants to be woken
        self._spec = _Itimerspec()
        self._libc = _libc()
        if self._libc is not None:
            fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self.fd = fd

    def arm(self, when: float) -> None:
        """Fire at monotonic time `when` (seconds), replacing any earlier arming."""
        if self.fd is None or when == self.armed_at:
            return
        # Never beyond an hour: a runaway estimate must not overflow timespec (that once
        # took the daemon down with EINVAL); the loop then just looks again early. 0 means
        # "disarm" to timerfd_settime; a time already passed still fires at once.
        ns = max(int(min(when, time.monotonic() + MAX_ARM_S) * 1e9), 1)
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(ns, 1_000_000_000)
        self._settime()
        self.armed_at = when

    def disarm(self) -> None:
        if self.fd is None or self.armed_at is None:
            return
        value = self._spec.it_value
        value.tv_sec = value.tv_nsec = 0
        self._settime()
        self.armed_at = None

    def clear(self) -> None:
        """Consume a firing (after poll reported the fd readable)."""
        if self.fd is None:
            return
        try:
            os.read(self.fd, 8)
        except BlockingIOError:  # re-armed since it fired: nothing to consume
            pass
        self.armed_at = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _settime(self) -> None:
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec),
                                      None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
