"""The I/O loop's periodic duties as one table (gunicorn's arbiter and uvicorn's main loop keep
theirs so): each row a name, its handler, how often it runs, and when it is next due. The loop
looks at `next_due` once a pass. Its poll wakes at least every LOOP_TICK_MS (server.py), so a
duty runs at most that late. Waking at each duty's exact time instead costs ten more wakeups a
second: at one camera at 25 Hz (noop backend, a noisy 2-core CPU, three runs each) the daemon's
CPU a request had medians of 605 us that way and 577 us this way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Duty:
    """`run(now)` every `every()` seconds (read at each run: a reload may change
    stats_interval), the first time `first` seconds after the loop starts."""

    __slots__ = ("due", "every", "first", "name", "run")

    def __init__(self, name: str, run: Callable[[float], object], every: Callable[[], float],
                 first: float = 0.0) -> None:
        self.name, self.run, self.every, self.first, self.due = name, run, every, first, 0.0


class Duties:
    """`guard(name, run, now)`: a duty that raises is logged and the loop goes on (_guard)."""

    def __init__(self, duties: list[Duty], guard: Callable[..., Any], now: float) -> None:
        self._duties, self._guard = duties, guard
        for duty in duties:
            duty.due = now + duty.first
        self.next_due = min(d.due for d in duties)

    def run_due(self, now: float) -> None:
        """Every duty due at `now`, in the table's order."""
        for duty in self._duties:
            if now >= duty.due:
                duty.due = now + duty.every()
                self._guard(duty.name, duty.run, now)
        self.next_due = min(d.due for d in self._duties)
