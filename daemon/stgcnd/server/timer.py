"""A wake-up timer the I/O loop can poll next to its sockets: a Linux timerfd.

ZeroMQ's poll timeout counts whole milliseconds, too coarse for a sub-millisecond batch; a
timerfd (through ctypes: os.timerfd_create is 3.13+) wakes poll within microseconds. Without
it `fd` is None and the loop rounds timeouts up to milliseconds.
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
