"""The memory policy on the test process's real resident size and a real ROUTER's
connections: the growth of a message that is then dropped cuts nobody queued behind it."""

from __future__ import annotations

import time

import numpy as np

from stgcnd.server.errorlog import ClientErrorLog
from stgcnd.server.heap import GROWTH_BYTES, RssWatch
from stgcnd.server.memory_policy import MemoryPolicy
from tests.server.test_connections import settle, setup  # noqa: F401  (the fixture)


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
