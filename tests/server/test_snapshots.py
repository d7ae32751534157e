"""Snapshot asks on the events socket (issue #41, item 5): a subscriber's first ask is answered
at once (its peer's first few), every other ask waits and all waiting ones, of every peer,
share one snapshot an interval; none is dropped; a peer past its (un)subscriptions an interval
is over the limit. Scripted times: the daemon's clock is the caller's."""

from __future__ import annotations

from stgcnd.server.snapshots import (
    PEER_SNAPSHOT_BURST,
    PEER_SUBSCRIPTION_MESSAGES,
    SNAPSHOT_EVERY_S,
    SNAPSHOT_INTERVAL_S,
    SnapshotAsks,
    common_prefix,
)


def test_a_new_subscriber_is_answered_at_once_and_later_asks_wait_for_the_interval():
    asks = SnapshotAsks()
    asks.subscribe(5, 100, "pid:1", b"cam1", now=1.0)
    assert asks.due(1.0) == {b"cam1"}
    asks.subscribe(5, 100, "pid:1", b"", now=1.5)      # a gap's resubscription: waits for
    assert asks.due(1.5) == {b""}                       # the waiting asks' turn, open now
    asks.subscribe(5, 100, "pid:1", b"cam2", now=2.0)
    for t in (2.0, 5.0, 1.5 + SNAPSHOT_INTERVAL_S - 0.01):
        assert asks.due(t) == set()
    assert asks.due(1.5 + SNAPSHOT_INTERVAL_S) == {b"cam2"}  # waited, never dropped
    assert asks.deferred == 2 and asks.sent == 3


def test_a_toggling_subscriber_causes_one_snapshot_an_interval():
    asks = SnapshotAsks()
    sent = 0
    t = 0.0
    while t < 3 * SNAPSHOT_INTERVAL_S:
        asks.subscribe(5, 100, "pid:1", b"", now=t)
        sent += bool(asks.due(t))
        asks.unsubscribe(5, 100, b"")
        t += 0.01
    assert sent == 4                        # its first at once, then 0.2 s, 10.2 s, 20.2 s


def test_a_peer_reconnecting_gets_its_burst_then_one_an_interval_and_others_are_not_delayed():
    asks = SnapshotAsks()
    sent = 0
    t = 0.0
    for fd in range(10, 10 + 60):          # a new connection every 250 ms for 15 s
        asks.subscribe(fd, fd, "pid:1", b"", now=t)
        sent += bool(asks.due(t))
        t += 0.25
    assert sent == PEER_SNAPSHOT_BURST + 2  # its burst, then the waiting asks at 2 s and 12 s
    asks.subscribe(999, 999, "pid:2", b"cam3", now=t)  # a legitimate late subscriber
    t += SNAPSHOT_EVERY_S
    assert b"cam3" in asks.due(t)


def test_waiting_asks_of_every_peer_share_one_snapshot_an_interval():
    asks = SnapshotAsks()
    for peer in range(20):                  # twenty churning processes, bursts spent
        for fd in range(PEER_SNAPSHOT_BURST):
            asks.subscribe(1000 * peer + fd, 1, f"pid:{peer}", b"", now=0.0)
    asks.due(0.0)
    sent = 0
    t = 0.0
    while t < 25.0:
        for peer in range(20):
            asks.subscribe(1000 * peer + 999, int(t * 100), f"pid:{peer}", b"", now=t)
        sent += bool(asks.due(t))
        t += 0.05
    assert sent == 3                        # at 0.05 s, 10.05 s and 20.05 s


def test_a_recycled_fd_is_a_new_subscriber():
    asks = SnapshotAsks()
    asks.subscribe(5, 100, "pid:1", b"", now=0.0)
    assert asks.due(0.0)
    asks.subscribe(5, 101, "pid:2", b"", now=1.0)     # another socket on the same number
    assert asks.due(1.0) == {b""}


def test_many_topics_merge_into_their_common_prefix():
    asks = SnapshotAsks()
    asks.subscribe(5, 100, "pid:1", b"x", now=0.0)
    asks.due(0.0)
    for i in range(100):
        asks.subscribe(5, 100, "pid:1", f"door-{i:03d}".encode(), now=1.0)
    assert asks.due(SNAPSHOT_INTERVAL_S) == {b"door-0"}  # the 17th merged; the rest in it
    assert common_prefix({b"abc", b"abd", b"ab"}) == b"ab"


def test_a_peer_over_its_subscriptions_an_interval_is_over_the_limit_until_the_next():
    asks = SnapshotAsks()
    assert not any(asks.over("uid:1", 0.0) for _ in range(PEER_SUBSCRIPTION_MESSAGES))
    assert asks.over("uid:1", 0.1) and asks.first_refusal("uid:1")
    assert not asks.first_refusal("uid:1")               # one log line an interval
    assert not asks.over("uid:2", 0.1)                   # per peer
    assert not asks.over("uid:1", SNAPSHOT_INTERVAL_S)   # a new interval
    asks.tidy({}, 3 * SNAPSHOT_INTERVAL_S)
    assert asks.first_refusal("uid:1")
