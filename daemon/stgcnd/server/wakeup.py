"""What wakes the I/O loop: a self-pipe it polls beside its sockets (gunicorn's arbiter),
written by signals and by worker threads, and the flags they set before writing it."""

from __future__ import annotations

import os
import signal
import threading


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
