"""The memory watch's decisions (server/heap.py), on sizes fed to it: growth, and when to trim."""

from __future__ import annotations

from stgcnd.server import heap
from stgcnd.server.heap import CONNECTION_BYTES, GROWTH_BYTES, TRIM_SLACK_BYTES, RssWatch

MB = 1 << 20


class FedWatch(RssWatch):
    def __init__(self) -> None:
        self.size = 100 * MB
        super().__init__(0)

    def rss(self) -> int:
        return self.size


def test_fast_growth_is_seen_and_connections_accepted_meanwhile_are_allowed_for():
    w = FedWatch()
    w.sample(0.0, 0)
    w.size += GROWTH_BYTES - MB
    w.sample(0.1, 0)
    assert not w.growing()
    w.size += 2 * MB
    w.sample(0.2, 0)
    assert w.growing() == GROWTH_BYTES + MB
    # the same growth while 1,000 connections came: a flood, not a message
    w = FedWatch()
    w.sample(0.0, 0)
    w.size += GROWTH_BYTES + MB
    w.sample(0.2, 1000)
    assert not w.growing() and 1000 * CONNECTION_BYTES > 2 * MB
    # slow growth leaves the window
    w = FedWatch()
    for i in range(40):
        w.size += MB
        w.sample(i * 0.1, 0)
    assert not w.growing()


def test_a_trim_follows_a_settled_rise_and_chains_only_while_it_gives_back(monkeypatch):
    w = FedWatch()
    freed = [TRIM_SLACK_BYTES, 0, 0]  # what each trim gives back

    def trim() -> bool:
        w.size -= freed.pop(0)
        return True

    monkeypatch.setattr(heap, "give_back_free_memory", trim)
    w.sample(0.0)
    w.size += TRIM_SLACK_BYTES + MB
    w.sample(0.1)
    assert not w.trim_due(0.1)  # still rising
    w.sample(0.2)
    assert w.trim_due(0.2)
    assert w.trim(0.2) == TRIM_SLACK_BYTES
    w.sample(0.5)
    assert not w.trim_due(0.5)  # at most once a second
    w.sample(1.3)
    assert w.trim_due(1.3)  # it gave back much: one more follows
    assert w.trim(1.3) == 0
    w.sample(2.5)
    assert not w.trim_due(2.5)  # that one gave back nothing: the chain ends
    w.trim_soon()  # an oversized message was dropped
    w.sample(2.6)
    assert w.trim_due(2.6)
    assert w.trims == 2


def test_own_growth_is_counted_and_settles_once_after_the_last_making():
    own = heap.OwnGrowth()
    assert not own.active and not own.settled()
    with own.during():
        with own.during():  # two models' upgrades made at once
            assert own.active
        assert own.active and not own.settled()  # one still making
    assert not own.active
    assert own.settled() and not own.settled()  # once: the limit is rebased once
    try:
        with own.during():
            raise RuntimeError("a making that fails still ends")
    except RuntimeError:
        pass
    assert not own.active and own.settled()
