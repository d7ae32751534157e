"""What the loop does about its memory, ten times a second (a duty of server.py's table):
give back what abuse and bursts left behind, and close the connections that send nothing when
the heap is over its limit or grows as fast as a peer's message does (server/heap.py measures;
docs/hardening.md says why). Reading requests is the loop's: the policy is handed it."""

from __future__ import annotations

from collections.abc import Callable

from stgcnd.server.connections import CLOSE_IDLE_S, Connections
from stgcnd.server.errorlog import ClientErrorLog
from stgcnd.server.heap import TRIM_EVERY_S, RssWatch

GROWTH_DEFER_CHECKS = 2   # heap growth with more requests waiting: the cut waits this many checks
# Growth spares connections younger than this: a new camera's first request may still be on
# its way, while a message growing the heap by GROWTH_BYTES (16 MB) at 300 MB/s is 50 ms old.
GROWTH_SPARES_NEW_S = 0.02
# ...and those that delivered a request within as long (a huge message is that old when
# first seen): a camera's request read late is not taken for one.
GROWTH_QUIET_S = 0.05


class MemoryPolicy:
    """`connections`: every socket's connections, as they are now. `read_waiting(now)`: read
    the requests and subscriptions already complete in the sockets' queues (a bounded amount);
    True when none was left waiting. `discarding()`: an oversized message is being dropped.
    `errors`: where memory_pressure is reported."""

    def __init__(self, watch: RssWatch, connections: Callable[[], list[Connections]],
                 read_waiting: Callable[[float], bool], discarding: Callable[[], bool],
                 errors: ClientErrorLog) -> None:
        self.watch = watch
        self._connections = connections
        self._read_waiting = read_waiting
        self._discarding = discarding
        self._errors = errors
        self._next_trim = 0.0
        self._growth_deferred = 0  # checks in a row that put a growth cut off (_may_cut)
        self._was_discarding = False

    def check(self, now: float, trim_asked: bool = False, own_growth: bool = False) -> None:
        """One check. `trim_asked`: an oversized message or a reply was dropped (trim once
        due). `own_growth`: the daemon makes models or runners of its own (a reload's, an
        upgrade's: heap.OwnGrowth), growing the heap as fast as a peer's message and past the
        limit: neither is a peer's, so only what a peer's message arriving looks like is cut
        meanwhile, never an idle camera or subscriber, and nothing is trimmed."""
        watch = self.watch
        discarding = self._discarding()
        if discarding and not self._was_discarding:
            # The growth so far was the message now being dropped, whole: it cuts nobody (the
            # requests queued behind it are not read until it is dropped, and their senders
            # would count as never delivering). Growth from here on is another peer's.
            watch.restart_growth()
        self._was_discarding = discarding
        rss = watch.sample(now, sum(c.accepted for c in self._connections()))
        if trim_asked:
            watch.trim_soon()
        over = watch.over(rss)
        # What is merely free goes back first (once a second); not while the daemon's own
        # making grows the heap: a trim walks all of it on the loop, to give back little.
        if over and now >= self._next_trim and not own_growth:
            self._next_trim = now + TRIM_EVERY_S
            watch.trim(now)
            over = watch.over()
        grown = watch.growing() if not over and not own_growth else 0
        like_a_message = bool(grown) or bool(over and own_growth)
        if like_a_message and not self._may_cut(now):
            return  # still reading what is waiting: the next check decides
        if over or grown:
            # Growth alone is also what a batch's own allocations look like (and being over
            # the limit what the daemon's own making does): then a connection goes only while
            # it sends what it has not delivered for GROWTH_QUIET_S (a message still
            # arriving, whatever was sent before it), never one owed a reply; and while a
            # message is dropped, only one that never delivered: the requests queued behind
            # it cannot be read meanwhile.
            quiet_s = None if discarding else GROWTH_QUIET_S
            closed = sum(c.shed_quiet(now, quiet_s, GROWTH_SPARES_NEW_S, sending=True)
                         if like_a_message else c.shed_quiet(now, CLOSE_IDLE_S)
                         for c in self._connections())
            if (over and not own_growth) or closed:
                self._errors.report("memory-pressure", event="memory_pressure",
                                    rss_mb=round((over or rss) / 2**20, 1),
                                    limit_mb=round(watch.limit / 2**20, 1),
                                    grown_mb=round(grown / 2**20, 1), closed=closed)
            if closed:
                watch.trim_soon()  # a cut message is freed as its connection goes
                watch.restart_growth()
        elif watch.trim_due(now):
            watch.trim(now)

    def _may_cut(self, now: float) -> bool:
        """Before growth closes the connections that never delivered a request, what is
        waiting is read, so that a camera whose request arrived during the batch that grew the
        heap counts as delivering (else it would be cut, and its request go unanswered). False
        while more waits, for at most GROWTH_DEFER_CHECKS checks in a row: a peer flooding
        small requests does not hold off the cut of a message still arriving."""
        if self._read_waiting(now) or self._growth_deferred >= GROWTH_DEFER_CHECKS:
            self._growth_deferred = 0
            return True
        self._growth_deferred += 1
        return False
