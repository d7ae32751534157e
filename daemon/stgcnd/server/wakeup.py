"""What wakes the I/O loop: a self-pipe it polls beside its sockets (gunicorn's arbiter),
written by signals and by worker threads, the flags they set before writing it, and a timer
(a Linux timerfd: poll's own timeout counts whole milliseconds, too coarse for a
sub-millisecond batch; os.timerfd_create is 3.13+, so ctypes)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import threading
import time
from typing import Any


class Wakeup:
    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            os.set_blocking(fd, False)
        self.stop = threading.Event()    # SIGTERM, SIGINT, a fatal error
        self.reload = threading.Event()  # SIGHUP
        self.fatal: BaseException | None = None
        self._signals = False

    def install_signal_handlers(self) -> None:
        """Main thread only: the handlers set a flag; the pipe wakes the loop to see it."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        signal.signal(signal.SIGHUP, lambda *_: self.reload.set())
        signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self._signals = True

    def fail(self, exc: BaseException) -> None:
        """A fatal device error (any thread): stop gracefully, exit 1."""
        self.fatal = exc
        self.stop.set()

    def wake(self) -> None:
        """From any thread: make the loop's next poll return."""
        try:
            os.write(self.write_fd, b"\0")
        except OSError:  # full (the loop is woken anyway), or closed at exit by a late worker
            pass

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._signals:
            signal.set_wakeup_fd(-1)
            self._signals = False
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


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
    """One-shot timer at an absolute monotonic time; `fd` becomes readable when it fires
    (None without a timerfd: the loop then rounds its timeouts up to milliseconds)."""

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
