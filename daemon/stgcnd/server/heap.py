"""The daemon's memory against what peers can make libzmq hold: the RSS watch, and giving
freed memory back (malloc_trim)."""

from __future__ import annotations

import ctypes
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Ten checks a second (docs/hardening.md, "What a huge message still costs").
CHECK_EVERY_S = 0.1
AUTO_HEADROOM_BYTES = 512 << 20   # auto limit: the RSS at READY plus this
# A message arriving grows libzmq's pipe far faster than the daemon's own memory grows after
# READY (docs/performance.md; a reload's models are exempt: memory_policy.py).
GROWTH_BYTES = 16 << 20
CONNECTION_BYTES = 64 << 10       # ...plus this much per connection accepted meanwhile (a
                                  # connection costs libzmq about 17 KB: a flood is no message)
GROWTH_WINDOW_S = 0.5
TRIM_SLACK_BYTES = 8 << 20        # settled this far above the last trim's result: trim
TRIM_EVERY_S = 1.0                # at most one trim this often
TRIM_GAVE_BACK_BYTES = 1 << 20    # a trim that returned this much is followed by another


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


# libzmq assembles a message whole before the daemon sees it, bounding a frame's size but
# not a message's (docs/hardening.md). So the loop watches its resident size and closes the
# connections that have not delivered a request lately when it is over the limit, or when it
# grew by GROWTH_BYTES within GROWTH_WINDOW_S: a message arriving that fast delivers nothing
# and is cut before it is complete. A batch's own allocations grow the heap as fast, so a
# connection owed a reply is never closed (server/connections.py). Freed memory goes
# back with malloc_trim(0), which walks the heap (milliseconds): only once the RSS settled
# TRIM_SLACK_BYTES above the last trim's, or after abuse, at most every TRIM_EVERY_S.
class RssWatch:
    """The process's resident size, read cheaply; `limit` in bytes (0: never over).

    `sample()` once per check (ten times a second) keeps the last GROWTH_WINDOW_S of sizes:
    `growing()` and `trim_due()` answer from them without another read."""

    def __init__(self, limit_mb: int) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no /proc: no watch
            self._fd = None
        self.auto = not limit_mb
        self.limit = limit_mb << 20
        # (monotonic, rss, connections accepted ever) of the last GROWTH_WINDOW_S
        self._recent: deque[tuple[float, int, int]] = deque(maxlen=64)
        self._trimmed = 0          # the RSS right after the last trim (or at READY)
        self._next_trim = 0.0
        self._follow_up = False    # trim again once due, whatever the slack
        self.trims = 0             # malloc_trim calls, ever
        self.rebase()

    def rebase(self) -> None:
        """The auto limit from the size now (at READY, and after a reload's models settled:
        a new model's legitimate memory must not read as a peer's)."""
        rss = self.rss()
        self._trimmed = rss
        self._recent.clear()
        if self.auto:
            self.limit = rss + AUTO_HEADROOM_BYTES if rss else 0

    def rss(self) -> int:
        if self._fd is None:
            return 0
        return int(os.pread(self._fd, 64, 0).split()[1]) * self._page

    def sample(self, now: float, accepted: int = 0) -> int:
        """Read the resident size and keep it for growing() and trim_due(); `accepted`: the
        connections accepted ever (server/connections.py)."""
        rss = self.rss()
        recent = self._recent
        recent.append((now, rss, accepted))
        while recent[0][0] < now - GROWTH_WINDOW_S:
            recent.popleft()
        return rss

    def over(self, rss: int | None = None) -> int:
        """The resident size when it is over the limit, else 0."""
        if not self.limit:
            return 0
        if rss is None:
            rss = self.rss()
        return rss if rss > self.limit else 0

    def growing(self) -> int:
        """By how much the size grew within GROWTH_WINDOW_S, when that is GROWTH_BYTES or
        more beyond what the connections accepted meanwhile cost (a message of millions of
        frames arriving), else 0."""
        recent = self._recent
        if len(recent) < 2:
            return 0
        (_, first, accepted_first), (_, last, accepted_last) = recent[0], recent[-1]
        grown = last - first  # a cut starts the window afresh (restart_growth)
        allowed = GROWTH_BYTES + (accepted_last - accepted_first) * CONNECTION_BYTES
        return grown if grown >= allowed else 0

    def trim_soon(self) -> None:
        """Something abusive was freed, or is being freed: trim once due (TRIM_EVERY_S after
        the last trim), whatever the slack."""
        self._follow_up = True

    def restart_growth(self) -> None:
        """Connections were cut for growing: measure growth afresh from the next sample."""
        self._recent.clear()

    def trim_due(self, now: float) -> bool:
        """The size settled (not 1 MB higher than at the check before) TRIM_SLACK_BYTES above the
        last trim's result, or a follow-up is asked for; at most once every TRIM_EVERY_S."""
        recent = self._recent
        if now < self._next_trim or not recent:
            return False
        rss = recent[-1][1]
        if rss < self._trimmed:
            self._trimmed = rss  # given back by itself: the new floor
        if len(recent) >= 2 and rss > recent[-2][1] + TRIM_GAVE_BACK_BYTES:
            return False  # still rising: the burst is not over
        return self._follow_up or rss > self._trimmed + TRIM_SLACK_BYTES

    def trim(self, now: float) -> int:
        """malloc_trim now; the bytes it gave back (a follow-up comes if that was much)."""
        before = self.rss()
        give_back_free_memory()
        after = self.rss()
        self.trims += 1
        self._trimmed = after
        self._next_trim = now + TRIM_EVERY_S
        self._follow_up = before - after >= TRIM_GAVE_BACK_BYTES
        return before - after

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class OwnGrowth:
    """Runners being made in this process beside the loop (an upgrade's, in its thread): the
    heap grows by design meanwhile, by gigabytes where torch compiles ten buckets (2.1 GB on
    an H100), which is no peer's message (server/memory_policy.py). Counted: two models'
    upgrades may be made at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._making = 0
        self._ended = False   # the last making ended since settled() was asked

    @contextmanager
    def during(self) -> Iterator[None]:
        with self._lock:
            self._making += 1
        try:
            yield
        finally:
            with self._lock:
                self._making -= 1
                self._ended = self._making == 0

    @property
    def active(self) -> bool:
        return self._making > 0

    def settled(self) -> bool:
        """True once after the last making ended: the runners it made (or what a failed one
        left) are the daemon's memory from then on, and the limit is based on it."""
        with self._lock:
            ended, self._ended = self._ended and self._making == 0, False
        return ended
