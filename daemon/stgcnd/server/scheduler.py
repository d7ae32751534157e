"""The dynamic batcher of one model: per-camera queues, drained round robin into batches.

A batch takes at most one job per camera while several have work, so a flooding camera can
neither starve nor lengthen everyone's batches. Batches are formed when an executor is free
(`max_queue_delay_us` may wait for a fuller one). The I/O loop alone uses it: no locks.
"""

from __future__ import annotations

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
    ts: float | None = None     # the client's time of the window (`ts`): the events' clock


class Scheduler:
    """Per-camera FIFO queues with a round-robin batch former (used by the I/O loop alone)."""

    def __init__(self, queue_size: int, max_queue_delay_us: int = 0) -> None:
        self.queue_size = queue_size
        self.delay_s = max_queue_delay_us / 1e6
        self._queues: dict[str, deque[Job]] = {}
        self._ready: deque[str] = deque()   # cameras with queued work, in serving order
        # Plain attributes, not properties: the executor reads both every loop pass.
        self.pending = 0       # jobs queued, over every camera
        self.closed = False    # close(): refuse new work

    def submit(self, job: Job) -> bool:
        """Queue a job; False when its camera already has queue_size jobs waiting (busy)."""
        if self.closed:
            return False
        q = self._queues.get(job.camera)
        if q is None:
            q = self._queues[job.camera] = deque()
        if len(q) >= self.queue_size:
            return False
        if not q:
            self._ready.append(job.camera)
        q.append(job)
        self.pending += 1
        return True

    def close(self) -> None:
        """Refuse new work; queued work is still handed out until none is left."""
        self.closed = True

    def drain(self) -> list[Job]:
        """Remove and return every queued job."""
        jobs = [j for q in self._queues.values() for j in q]
        self._queues.clear()
        self._ready.clear()
        self.pending = 0
        return jobs

    def take(self, max_batch: int, now: float) -> tuple[list[Job] | None, float | None]:
        """(batch, None): run it now; ([], t): max_queue_delay_us says look again at t
        (monotonic) for a fuller batch; ([], None): nothing queued; (None, None): closed and
        empty, the executor should finish."""
        if not self.pending:
            return (None if self.closed else []), None
        if self.delay_s and self.pending < max_batch and not self.closed:
            # Counted from the oldest job's arrival, never beyond it: a request's added
            # latency is bounded by the configured delay whatever the traffic.
            end = min(self._queues[c][0].received for c in self._ready) + self.delay_s
            if now < end:
                return [], end
        return self._form(max_batch), None

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
        self.pending -= len(batch)
        return batch
