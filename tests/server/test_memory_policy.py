"""The memory policy on the test process's real resident size and a real ROUTER's
connections: the growth of a message that is then dropped cuts nobody queued behind it, and
the daemon's own making of runners (an upgrade's) past the limit cuts no idle connection."""

from __future__ import annotations

import time

import numpy as np

from stgcnd.server.errorlog import ClientErrorLog
from stgcnd.server.heap import GROWTH_BYTES, RssWatch
from stgcnd.server.memory_policy import MemoryPolicy
from tests.server.test_connections import request, settle, setup  # noqa: F401  (the fixture)


def test_the_growth_of_a_message_being_dropped_cuts_nobody_but_growth_after_it_does(setup):  # noqa: F811
    """A complete message of a million frames is dropped over many loop passes while the
    requests of newcomers wait behind it in the ROUTER: they count as never delivered, and the
    heap grew within the growth window (the message itself). CI lost a newcomer's ping that
    way. The growth up to the drop's start is that message's; growth after it is another
    peer's and cuts the silent (at its second check)."""
    make, peers, _ = setup
    conns = make(cap=10)
    peers.open(1)
    settle(conns, 1)
    discarding = [False]
    policy = MemoryPolicy(RssWatch(0), lambda: [conns], read_waiting=lambda now: True,
                          discarding=lambda: discarding[0], errors=ClientErrorLog())
    now = time.monotonic() + 1.0
    policy.check(now)
    held = [np.ones(4 * GROWTH_BYTES // 8)]  # touched pages: the RSS grows 4 x GROWTH_BYTES
    discarding[0] = True  # the message that grew it is complete and being dropped
    for i in range(1, 6):
        policy.check(now + 0.1 * i)
    assert len(conns) == 1, "a connection queued behind the dropped message was cut"
    discarding[0] = False
    held.append(np.ones(4 * GROWTH_BYTES // 8))  # another peer's message arriving
    for i in range(6, 9):
        policy.check(now + 0.1 * i)
    settle(conns, 0)
    del held


class Reports(ClientErrorLog):
    """The reports made, kept (and logged as the daemon's are)."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: list[str] = []

    def report(self, kind: str, *args: object, **fields: object) -> None:  # type: ignore[override]
        self.kinds.append(kind)
        super().report(kind, *args, **fields)


def test_over_the_limit_while_the_daemon_makes_runners_no_idle_connection_is_cut(setup):  # noqa: F811
    """An upgrade's runners made in the daemon grow the heap past the limit (2.1 GB for torch's
    ten tuned buckets on an H100, against READY's size + 512 MB): a camera quiet for seconds
    and a subscriber stay, nothing is trimmed; once the making is over the same size cuts them
    (what it did during the making before: every subscriber, every second)."""
    make, peers, router = setup
    conns = make(cap=10)
    quiet, silent = peers.open(2)
    settle(conns, 2)
    quiet.send(b"hello")
    request(router, conns)  # delivered once, then quiet
    watch = RssWatch(1)  # 1 MB: this process is always over it
    reports = Reports()
    policy = MemoryPolicy(watch, lambda: [conns], read_waiting=lambda now: True,
                          discarding=lambda: False, errors=reports)
    now = time.monotonic() + 5.0  # the quiet one's request is 5 s old
    for i in range(20):
        policy.check(now + 0.1 * i, own_growth=True)
    # What growth cuts, being over the limit meanwhile does: a connection that never
    # delivered a request (its first message may be a huge one), once, and said once.
    settle(conns, 1)
    assert reports.kinds == ["memory-pressure"] and watch.trims == 0
    quiet.send(b"still served")
    request(router, conns)
    policy.check(now + 7.1)  # the making is over; the limit still this low: quiet 2 s
    settle(conns, 0)
    assert reports.kinds == ["memory-pressure"] * 2 and watch.trims == 1
    del silent
