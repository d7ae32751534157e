"""Python's cyclic garbage collector, kept off the I/O loop's tail.

A full collection walks every object the interpreter tracks. With torch and a model loaded
that is about 170,000 objects, and one collection took 90-150 ms on our 2-core CPU VM. The
I/O loop holds the GIL meanwhile and serves nobody, so every camera's reply waits: a p99
spike that no batching can hide. CPython starts a full collection on its own once enough
objects have survived since the last one.

The objects alive at READY (modules, backends, runners, graphs' Python side) live until the
daemon exits. So at READY they are collected once, then moved to the permanent generation
(`gc.freeze`, Python 3.7+), which later collections do not walk. Per-request objects die by
reference counting as before; the collector still finds cycles among what serving made
since. A reload that brings new models freezes again once they are in place.

`GcWatch` counts the collector's passes per generation and keeps their longest and total
pause, for the `stats` reply and the periodic `gc` log line: the evidence that a tail
is, or is not, the collector's.

Measured (docs/benchmarks.md, session 7 run 4, H100 host, 64 and 128 cameras x 25 Hz):
serving made no full collection in 40 s (CPython starts one only once the objects surviving
since the last exceed a quarter of the long-lived heap), and no pass took over 1.5 ms. The
frozen daemons did not serve better; their tails were worse in both rounds, for reasons not
found. So the freeze is off by default (`[server] gc_freeze = true` turns it on) and the
watch stays: it tells whether a tail on a given device is the collector's.
"""

from __future__ import annotations

import gc
import time
from typing import Any


def freeze_survivors() -> int:
    """Collect what is garbage now (what an earlier freeze exempted included: after a reload
    it holds the retired models), then exempt every live object from later collections.
    Returns how many objects are frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcWatch:
    """Collections per generation and their pauses, from gc.callbacks (no polling)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.max_pause_ms = 0.0
        self.total_pause_ms = 0.0
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def remove(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        ms = (time.perf_counter() - self._started) * 1e3
        self.collections[info.get("generation", 0)] += 1
        self.total_pause_ms += ms
        if ms > self.max_pause_ms:
            self.max_pause_ms = ms

    def stats(self) -> dict[str, Any]:
        return {"collections": list(self.collections),
                "max_pause_ms": round(self.max_pause_ms, 3),
                "total_pause_ms": round(self.total_pause_ms, 3),
                "frozen": gc.get_freeze_count()}
