"""The dynamic batcher of one model: per-camera queues, drained round robin into batches.

The I/O loop submits jobs; the model's executors take batches. When several cameras have
work, a batch takes at most one job from each, starting where the previous batch stopped: a
camera that floods its queue gets one slot per batch like everyone else, so it can neither
starve another nor make everyone's batches longer (on a CPU a batch costs in proportion to its
size), and its own queue bound answers `busy` to the excess. A camera alone with work may fill
a batch with its queued jobs (one client scoring many windows still gets batching).

Batches are formed when a device is free: an executor asks for work the moment it finishes the
previous batch and gets whatever is queued, up to its largest bucket. `max_queue_delay_us`
(default 0) lets it wait that long for a fuller batch, but only while the batch is not full.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Job:
    """One inference request in flight: everything needed to run it and to answer it."""

    identity: bytes             # the client's ZeroMQ routing id
    req_id: int
    camera: str
    model: str                  # the served model's name
    op: str                     # "infer" or "push"
    window: np.ndarray          # (3, T, V, M), read-only or owned
    lane: int                   # the camera's lane (its CUDA stream and pinned rows)
    received: float             # monotonic seconds, when the I/O loop read it
    deadline: float | None      # monotonic seconds, or None
    extra: dict[str, Any] = field(default_factory=dict)  # push: ready/frames/seq for the reply


class Scheduler:
    """Thread-safe per-camera FIFO queues with a round-robin batch former."""

    def __init__(self, queue_size: int, max_queue_delay_us: int = 0) -> None:
        self.queue_size = queue_size
        self.delay_s = max_queue_delay_us / 1e6
        self._queues: dict[str, deque[Job]] = {}
        self._ready: deque[str] = deque()   # cameras with queued work, in serving order
        self._pending = 0
        self._closed = False
        self._idle = 0   # executors waiting in take(): only they need a wake-up
        self._cond = threading.Condition(threading.Lock())

    # -- the I/O loop's side ---------------------------------------------------------------
    def submit(self, job: Job, wake: bool = True) -> bool:
        """Queue a job; False when its camera already has queue_size jobs waiting (busy).

        wake=False leaves waking an idle executor to a later `wake()`: the I/O loop queues a
        whole burst of requests and wakes once, just before it blocks in poll (see wake)."""
        with self._cond:
            if self._closed:
                return False
            q = self._queues.get(job.camera)
            if q is None:
                q = self._queues[job.camera] = deque()
            if len(q) >= self.queue_size:
                return False
            if not q:
                self._ready.append(job.camera)
            q.append(job)
            self._pending += 1
            if self._idle and wake:  # a busy executor takes this job when it asks next
                self._cond.notify()
        return True

    def wake(self) -> None:
        """Wake an idle executor if work is queued (after submits with wake=False).

        Called by the I/O loop right before it blocks in poll, which releases the GIL: the
        woken executor then finds the GIL free. Woken mid-burst, it would wake only to wait
        for the GIL the loop still holds, a second sleep and wake-up per hand-off; and a burst
        of requests costs one wake-up, not one per request."""
        if self._idle and self._pending:
            with self._cond:
                if self._idle and self._pending:
                    self._cond.notify()

    def queued(self, camera: str) -> int:
        q = self._queues.get(camera)
        return len(q) if q is not None else 0

    @property
    def pending(self) -> int:
        return self._pending

    def close(self) -> None:
        """Refuse new work and wake every executor; queued work is still handed out by `take`
        until none is left, then `take` returns None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def drain(self) -> list[Job]:
        """Remove and return every queued job (shutdown after the drain deadline)."""
        with self._cond:
            jobs = [j for q in self._queues.values() for j in q]
            self._queues.clear()
            self._ready.clear()
            self._pending = 0
            return jobs

    # -- the executors' side ---------------------------------------------------------------
    def take(self, max_batch: int, timeout: float) -> list[Job] | None:
        """Up to max_batch jobs, round robin over cameras; [] after `timeout` with no work;
        None once closed and empty (the executor should exit)."""
        with self._cond:
            end = time.monotonic() + timeout
            while not self._pending:
                if self._closed:
                    return None
                left = end - time.monotonic()
                if left <= 0:
                    return []
                self._wait(left)
            if self.delay_s and self._pending < max_batch:
                self._wait_for_fuller(max_batch)
            return self._form(max_batch)

    def take_now(self, max_batch: int, now: float) -> tuple[list[Job] | None, float | None]:
        """`take` for an executor the I/O loop drives, which must never wait here.

        (batch, None): run it now; ([], t): max_queue_delay_us says look again at t
        (monotonic) for a fuller batch; ([], None): nothing queued; (None, None): closed and
        empty, the executor should finish."""
        with self._cond:
            if not self._pending:
                return (None if self._closed else []), None
            if self.delay_s and self._pending < max_batch and not self._closed:
                end = self._fuller_by()
                if now < end:
                    return [], end
            return self._form(max_batch), None

    def _wait_for_fuller(self, max_batch: int) -> None:
        end = self._fuller_by()
        while self._pending < max_batch and not self._closed:
            left = end - time.monotonic()
            if left <= 0:
                return
            self._wait(left)

    def _fuller_by(self) -> float:
        # Counted from the oldest job's arrival, never beyond it: a request's added latency is
        # bounded by the configured delay whatever the traffic.
        return min(self._queues[c][0].received for c in self._ready) + self.delay_s

    def _wait(self, timeout: float) -> None:
        # Counted while waiting, so that submit() wakes an executor only when one is idle.
        self._idle += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._idle -= 1

    def _form(self, max_batch: int) -> list[Job]:
        batch: list[Job] = []
        if len(self._ready) > 1:
            max_batch = min(max_batch, len(self._ready))  # one pass: one job per camera
        while self._ready and len(batch) < max_batch:
            camera = self._ready.popleft()
            q = self._queues[camera]
            batch.append(q.popleft())
            if q:
                self._ready.append(camera)
            else:
                del self._queues[camera]
        self._pending -= len(batch)
        return batch
