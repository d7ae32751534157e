"""CPython's full garbage collections held off while a model is loaded beside the I/O loop.

Loading beside the loop (an upgrade's runtime and runners, a reload's models) makes hundreds of
thousands of long-lived Python objects: torch.compile's tracing above all. Each time they grow
by a quarter, CPython runs a full collection over every object the process holds, with the GIL
held throughout: two of 227-253 ms while torch.compile loaded three batch sizes of the demo
model from its cache on a 2-core VM, six of up to 520 ms when it compiled them cold
(`scripts/off_loop_stall.py`, docs/performance.md). The loop cannot run meanwhile, so every
camera's reply waits. While such work runs only the young collections run (they free the
short-lived garbage, which is the bulk of it); the full ones come back when the last ends. The
hold also covers an upgrade's wait for its build child, during which the process makes few
long-lived objects.

CPython 3.8-3.13 run a full collection only once `threshold2` young-generation collections have
run (and the old generation grew by a quarter), so a very large `threshold2` holds them off.
(CPython 3.14 collects the old generation in increments instead and ignores `threshold2`.)
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HELD_OFF = 1 << 30  # young-generation collections before a full one: never, in practice


class _Holders:
    """How many run now, and the thresholds to give back when the last ends."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.saved: tuple[int, int, int] = gc.get_threshold()


_HOLDERS = _Holders()


@contextmanager
def held_off() -> Iterator[None]:
    """No full collection starts inside it, in any thread (the thresholds are process-wide;
    holders may overlap and nest: the last to end gives the thresholds back)."""
    h = _HOLDERS
    with h.lock:
        if h.count == 0:
            h.saved = gc.get_threshold()
            gc.set_threshold(h.saved[0], h.saved[1], HELD_OFF)
        h.count += 1
    try:
        yield
    finally:
        with h.lock:
            h.count -= 1
            if h.count == 0:
                gc.set_threshold(*h.saved)
