"""The garbage collector's freeze at READY and its pause counters (server/gcpause.py)."""

from __future__ import annotations

import gc

from stgcnd.server.gcpause import GcWatch, freeze_survivors


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> None:
    a, b = _Node(), _Node()
    a.other, b.other = b, a


def test_freeze_exempts_survivors_and_frees_garbage_first():
    gc.unfreeze()
    try:
        _cycle()                     # garbage before the freeze: collected, not frozen
        alive = [_Node() for _ in range(50)]
        frozen = freeze_survivors()
        assert frozen == gc.get_freeze_count() >= len(alive)
        assert not any(isinstance(o, _Node) for o in gc.get_objects())  # all frozen or freed
        _cycle()                     # garbage made after the freeze is still collected
        assert gc.collect() >= 2
    finally:
        gc.unfreeze()


def test_watch_counts_collections_and_pauses():
    watch = GcWatch()
    watch.install()
    try:
        gc.collect(0)
        gc.collect(2)
        stats = watch.stats()
    finally:
        watch.remove()
    assert stats["collections"][0] >= 1 and stats["collections"][2] >= 1
    assert stats["total_pause_ms"] >= stats["max_pause_ms"] > 0
    gc.collect(2)                    # removed: no longer counted
    assert watch.stats()["collections"] == stats["collections"]
