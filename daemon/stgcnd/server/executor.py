"""Executors: what runs a model's batches (Triton's model instances).

`ExecutorBase` is what every executor does with a batch: refuse jobs that cannot finish in
time (`expired`, judged by the warmed-up compute time of the bucket the batch runs in, never by
set-up), run the rest, keep the compute estimate, and turn logits into one reply per job.

Two kinds drive it (the model's `dispatch`):
- `Executor` here: a thread that owns one BatchRunner. It makes the runner (CUDA streams,
  graphs per bucket, client lanes), warms every bucket and only then reports ready: the daemon
  says READY=1 after all executors did. From then on it takes a batch from the model's
  scheduler whenever it is free, runs it to the end and hands the replies to the I/O loop. For
  CPU runtimes, whose compute would otherwise stall the loop. The runner is closed by the same
  thread at the end.
- `stgcnd.server.loop_executor.LoopExecutor`: driven by the I/O loop itself, for runners that
  only enqueue device work (CUDA graphs): no thread hand-off on a request's path.

Liveness (gunicorn's arbiter): `heartbeat` is a monotonic timestamp refreshed on every pass of
the executor's loop; `busy_since` is set while a batch runs. The watchdog trusts only these.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stgcnd.log import get_logger
from stgcnd.server.outbox import Outbox, Reply
from stgcnd.server.scheduler import Job, Scheduler
from stgcnd.threadname import name_os_thread
from stgcnd_client.protocol import ErrorCode, encode_reply

log = get_logger(__name__)

TAKE_TIMEOUT_S = 0.5
EWMA = 0.2


def is_fatal(exc: BaseException) -> bool:
    """The GPU is in an unrecoverable state: the process must exit and be restarted."""
    mod = type(exc).__module__ or ""
    text = str(exc)
    return (mod.startswith("pycuda") or "CUDA error" in text or "cudaError" in text
            or "illegal memory access" in text)


class ExecutorBase:
    """What every executor does with a batch, whichever thread drives it: refuse what cannot
    finish in time, run the rest, keep the compute estimate, turn logits into replies."""

    def __init__(self, model: Any, index: int, scheduler: Scheduler, buckets: Sequence[int],
                 lanes: int, warmup_runs: int,
                 on_fatal: Callable[[BaseException], None]) -> None:
        self.model = model                 # stgcnd.server.models.ServedModel
        self._index = index
        self.scheduler = scheduler
        self._bucket_sizes = tuple(buckets)
        self._lanes = lanes
        self._warmup_runs = warmup_runs
        self._on_fatal = on_fatal
        self.error: BaseException | None = None
        self.heartbeat = time.monotonic()
        self.busy_since: float | None = None
        self.drain_deadline: float | None = None   # set at shutdown
        self.compute_ms: dict[int, float] = {}     # bucket -> warmed compute estimate
        self.buckets: tuple[int, ...] = ()
        self.batches = 0
        self.windows = 0

    def _prepare_runner(self) -> Any:
        """Make this executor's runner and warm every bucket (set-up never on a request's
        path); the runner is closed again if warming fails."""
        runner = self.model.backend.open_runner(self._bucket_sizes, self._lanes)
        try:
            self.compute_ms = dict(runner.warm_up(self._warmup_runs))
            self.buckets = runner.buckets
        except BaseException:
            runner.close()
            raise
        return runner

    def estimate_ms(self, n: int) -> float:
        """Expected compute time of a batch of n (its bucket's warmed-up estimate)."""
        for b in self.buckets:
            if b >= n:
                return self.compute_ms.get(b, 0.0)
        return self.compute_ms.get(self.buckets[-1], 0.0) if self.buckets else 0.0

    def _sort(self, jobs: list[Job], now: float) -> tuple[list[Reply], list[Job]]:
        """(replies for jobs that must not run, the jobs to run)."""
        if self.drain_deadline is not None and now > self.drain_deadline:
            message = "the daemon is shutting down; retry on its restart"
            return [error_reply(j, ErrorCode.SHUTTING_DOWN, message, "shutting-down")
                    for j in jobs], []
        replies: list[Reply] = []
        eta = now + self.estimate_ms(len(jobs)) / 1e3
        runnable = []
        for job in jobs:
            if job.deadline is not None and eta > job.deadline:
                replies.append(error_reply(job, ErrorCode.EXPIRED, (
                    f"deadline passed: {(now - job.received) * 1e3:.1f} ms in queue and a "
                    f"batch of {len(jobs)} takes ~{self.estimate_ms(len(jobs)):.1f} ms; "
                    "raise timeout_ms or add capacity"), "expired"))
            else:
                runnable.append(job)
        return replies, runnable

    def _failed(self, jobs: list[Job], exc: Exception) -> list[Reply]:
        log.error("batch_failed", model=self.model.name, batch=len(jobs),
                  error=f"{type(exc).__name__}: {exc}")
        if is_fatal(exc):
            self._on_fatal(exc)
        message = f"inference failed: {type(exc).__name__}: {exc}"
        return [error_reply(j, ErrorCode.INTERNAL, message, "error") for j in jobs]

    def _finished(self, runner: Any, jobs: list[Job], logits: np.ndarray, started: float
                  ) -> list[Reply]:
        t = runner.last_timings
        compute_ms = float(t.get("compute_ms", t.get("total_ms", 0.0)))
        bucket = runner.bucket_for(len(jobs))
        old = self.compute_ms.get(bucket)
        self.compute_ms[bucket] = compute_ms if old is None else (1 - EWMA) * old + EWMA * \
            compute_ms
        self.batches += 1
        self.windows += len(jobs)
        stages = {k: round(float(v), 3) for k, v in t.items()
                  if k in ("h2d_ms", "d2h_ms", "upload_ms", "download_ms")}
        return self.model.replies(jobs, logits, started, compute_ms, len(jobs), bucket, stages)


class Executor(ExecutorBase, threading.Thread):
    """An executor thread: takes a batch whenever it is free and runs it to the end."""

    def __init__(self, model: Any, index: int, scheduler: Scheduler, outbox: Outbox,
                 buckets: Sequence[int], lanes: int, warmup_runs: int,
                 on_fatal: Callable[[BaseException], None], prepared: Any = None) -> None:
        """prepared: (runner, compute_ms, buckets) already made and warmed (LoopExecutor.
        hand_over), served as it is; None: this thread makes its own."""
        ExecutorBase.__init__(self, model, index, scheduler, buckets, lanes, warmup_runs,
                              on_fatal)
        threading.Thread.__init__(self, name=f"executor-{model.name}-{index}", daemon=True)
        self.outbox = outbox
        self.ready = threading.Event()
        self._prepared = prepared

    # -- start-up, in this thread ----------------------------------------------------------
    def _take_runner(self) -> Any:
        if self._prepared is None:
            return self._prepare_runner()
        runner, compute_ms, buckets = self._prepared
        self._prepared = None
        self.compute_ms, self.buckets = dict(compute_ms), tuple(buckets)
        return runner

    def run(self) -> None:
        name_os_thread(f"exec{self._index}-{self.model.name}")
        try:
            runner = self._take_runner()
        except BaseException as exc:
            self.error = exc
            self.ready.set()
            return
        try:
            writer = self.outbox.writer()
        except BaseException as exc:
            self.error = exc
            self.ready.set()
            runner.close()
            return
        self.ready.set()
        try:
            self._serve(runner, writer)
        finally:
            writer.close(0)
            runner.close()

    # -- the loop --------------------------------------------------------------------------
    def _serve(self, runner: Any, writer: Any) -> None:
        while True:
            self.heartbeat = time.monotonic()
            jobs = self.scheduler.take(runner.max_batch, TAKE_TIMEOUT_S)
            if jobs is None:
                return
            if not jobs:
                continue
            replies = self._answer(runner, jobs)
            self.outbox.put(replies, writer)

    def _answer(self, runner: Any, jobs: list[Job]) -> list[Reply]:
        replies, runnable = self._sort(jobs, time.monotonic())
        if runnable:
            replies.extend(self._run(runner, runnable))
        return replies

    def _run(self, runner: Any, jobs: list[Job]) -> list[Reply]:
        started = time.monotonic()
        self.busy_since = started
        try:
            logits = runner.run([j.window for j in jobs], [j.lane for j in jobs])
        except Exception as exc:
            return self._failed(jobs, exc)
        finally:
            self.busy_since = None
            self.heartbeat = time.monotonic()
        return self._finished(runner, jobs, logits, started)


def error_reply(job: Job, code: ErrorCode, message: str, outcome: str) -> Reply:
    return Reply(job, encode_reply(job.req_id, error=(code.value, message)), outcome)
