"""The I/O loop's periodic duties as one table: each row a name, its handler, how often it runs
and when it is next due (gunicorn's arbiter and uvicorn's main loop keep theirs the same way).
The loop asks `next_due` once a pass, and the poll waits no longer than the earliest row."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# One duty's run, contained: a handler that raises is logged and the loop goes on (Server._guard).
Guard = Callable[..., Any]


class Duty:
    """`run(now)` every `every()` seconds, read after each run (a reload may change it:
    stats_interval), the first `first` seconds after the loop starts."""

    __slots__ = ("due", "every", "first", "name", "run")

    def __init__(self, name: str, run: Callable[[float], object], every: Callable[[], float],
                 first: float = 0.0) -> None:
        self.name = name
        self.run = run
        self.every = every
        self.first = first
        self.due = 0.0


class Duties:
    def __init__(self, duties: list[Duty], guard: Guard, now: float) -> None:
        self._duties = duties
        self._guard = guard
        for duty in duties:
            duty.due = now + duty.first
        self.next_due = min((d.due for d in duties), default=math.inf)

    def run_due(self, now: float) -> None:
        """Every duty due at `now`, in the table's order, each through the guard."""
        for duty in self._duties:
            if now >= duty.due:
                duty.due = now + duty.every()
                self._guard(duty.name, duty.run, now)
        self.next_due = min(d.due for d in self._duties)

    def wait_ms(self, now: float, longest_ms: int) -> int:
        """How long the poll may wait for the earliest duty: at most `longest_ms`, whole
        milliseconds rounded up (a duty runs at its time, never a millisecond early)."""
        wait = math.ceil((self.next_due - now) * 1e3)
        return longest_ms if wait > longest_ms else wait if wait > 0 else 0
