"""What the interpreter does while work runs beside the I/O loop: the loop first.

The loop and the threads beside it (executors waiting on their batches; `models.in_thread`'s
work: an upgrade's build, load and runners, a pause's runners, a reload) share one
interpreter lock. Two things stop the loop while a model loads beside it (measured with
`scripts/off_loop_stall.py`, docs/performance.md):

- CPython's full garbage collections. Loading makes hundreds of thousands of long-lived
  objects (torch.compile's tracing above all); each time they grow by a quarter, a full
  collection walks every object the process holds with the lock held: two of 227-253 ms
  while torch.compile loaded three batch sizes of the demo model from its cache on a 2-core
  VM, six of up to 520 ms when it compiled them cold. While such work runs only the young
  collections run (they free the short-lived garbage, the bulk of it); the full ones come
  back when the last ends. CPython 3.8-3.13 run a full collection only after `threshold2`
  young-generation ones, so a very large `threshold2` holds them off (3.14 collects the old
  generation in increments and ignores it). The hold also covers an upgrade's wait for its
  build child, when the process makes few long-lived objects.
- The lock's hand-over. Each time the loop lets the lock go (every ZeroMQ call does) a busy
  thread takes it, and the loop waits up to a switch interval to get it back. Serving,
  LOOP_SWITCH_S bounds how long a busy loop holds back an executor whose batch is done (5 ms,
  Python's default, was too long) at a cost of a few hundred switches a second; while a model
  loads, the shorter LOADING_SWITCH_S gives the loop its lock back sooner: beside the same
  compile, round trip p99 6.8-7.5 ms and max 41-48 ms against 9.2-10.1 and 231-236 ms in a
  plain thread, the compile as fast.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

LOOP_SWITCH_S = 0.0005      # the interpreter's switch interval while the loop serves
LOADING_SWITCH_S = 0.00005  # ... and while work runs beside it
HELD_OFF = 1 << 30          # young-generation collections before a full one: never, in practice


class _State:
    """The holders running now, the thresholds to give back when the last ends, and whether
    the loop serves (the switch intervals are its: before it runs, they are left alone)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.saved: tuple[int, int, int] = gc.get_threshold()
        self.serving = False

    def apply_switch_interval(self) -> None:
        if self.serving:
            sys.setswitchinterval(LOADING_SWITCH_S if self.holders else LOOP_SWITCH_S)


_STATE = _State()


def loop_serves() -> None:
    """The loop runs from now on (server.serve): the serving switch interval, or the loading
    one while work runs beside it."""
    with _STATE.lock:
        _STATE.serving = True
        _STATE.apply_switch_interval()


@contextmanager
def work() -> Iterator[None]:
    """Work beside the loop runs inside: no full collection starts (in any thread) and the
    loop gets the lock back sooner. Process-wide; holders may overlap and nest: the last to
    end gives the thresholds and the serving switch interval back."""
    s = _STATE
    with s.lock:
        if s.holders == 0:
            s.saved = gc.get_threshold()
            gc.set_threshold(s.saved[0], s.saved[1], HELD_OFF)
        s.holders += 1
        s.apply_switch_interval()
    try:
        yield
    finally:
        with s.lock:
            s.holders -= 1
            if s.holders == 0:
                gc.set_threshold(*s.saved)
            s.apply_switch_interval()
