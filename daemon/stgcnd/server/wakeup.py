"""The self-pipe (gunicorn's arbiter): one fd the I/O loop polls next to its sockets,
written by `signal.set_wakeup_fd` and by the worker threads of blocking runners when a batch
is done (runtimes.base.InWorker). The loop drains it and looks at everything.
"""

from __future__ import annotations

import os
import signal


class SelfPipe:
    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        for fd in (self.read_fd, self.write_fd):
            os.set_blocking(fd, False)
        self._signals = False

    def wake(self) -> None:
        """From any thread: make the loop's next poll return."""
        try:
            os.write(self.write_fd, b"\0")
        except BlockingIOError:  # the pipe is full: the loop is woken anyway
            pass
        except OSError:  # closed at exit while a worker finished late
            pass

    def route_signals(self) -> None:
        """Signals wake the loop too (main thread only)."""
        signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self._signals = True

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
