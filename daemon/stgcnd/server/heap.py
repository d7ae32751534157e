"""The daemon's memory against what peers can make it hold.

libzmq assembles a message whole before the daemon sees its first frame, and bounds a frame's
size but not a message's: a peer that sends frames with the "more" flag and never the last one
makes the daemon's I/O thread buffer them without end, invisibly to the loop, until the kernel
kills the process. The loop watches its resident size instead (RssWatch, a 2 us read of
/proc/self/statm, ten times a second) and, over the limit, closes the connections that have
not delivered a request lately (server/connections.py): libzmq drops a half-received message
when its connection goes. A camera sending windows is never quiet long enough to be closed.

What a hostile peer made the daemon hold is freed when the peer goes, but glibc keeps freed
small blocks in its heap and the process's RSS stays up: malloc_trim(0) returns the free pages
to the system. It walks the heap (milliseconds), so the loop calls it only after something
abusive happened (at the next stats tick), or at most once a second while over the limit,
never on the request path.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

CHECK_EVERY_S = 0.1
AUTO_HEADROOM_BYTES = 512 << 20   # auto limit: the RSS at READY plus this


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim  # glibc; absent on musl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    return fn


_TRIM = _malloc_trim()


def give_back_free_memory() -> bool:
    """Return the heap's free pages to the system; False where libc cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class RssWatch:
    """The process's resident size, read cheaply; `limit` in bytes (0: never over)."""

    def __init__(self, limit_mb: int) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no /proc: no watch
            self._fd = None
        self.auto = not limit_mb
        self.limit = limit_mb << 20
        if self.auto:
            self.rebase()

    def rebase(self) -> None:
        """The auto limit from the size now (at READY, and after a reload's models settled:
        a new model's legitimate memory must not read as a peer's)."""
        if self.auto:
            rss = self.rss()
            self.limit = rss + AUTO_HEADROOM_BYTES if rss else 0

    def rss(self) -> int:
        if self._fd is None:
            return 0
        return int(os.pread(self._fd, 64, 0).split()[1]) * self._page

    def over(self) -> int:
        """The resident size when it is over the limit, else 0."""
        if not self.limit:
            return 0
        rss = self.rss()
        return rss if rss > self.limit else 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
