"""An executor the I/O loop drives: no thread between a request and the device.

For runners whose `launch` only enqueues device work (CUDA graphs, noop; see
BatchRunner.nonblocking) a thread per executor buys nothing but hand-offs. With one, a request
crossed four threads: the loop queued it and woke the executor, the executor launched the batch
and slept on its completion event, CUDA's event thread woke it, and it woke the loop to send
the replies; each hand-off costs a wake-up and a turn at the GIL (docs/benchmarks.md measured
them as most of the daemon's CPU per request). Here the loop launches the batch itself, arms
its timer for when the device should be done, keeps serving other cameras meanwhile, and
finishes the batch on the pass where the runner says it is done.

The runner is made and warmed by whichever thread starts the model (the main thread at start,
the reload thread on SIGHUP), before READY, and `attach`ed to the loop's thread on first use.

When to look: each bucket has an estimate of launch-to-done time, seeded by the warm-up and
then tracking the 90th percentile of where its batches finish (a batch done at the first look
pulls it earlier by a little, one that needed another look pushes it later by nine times as
much, so that about one batch in ten needs a second look). A look costs the loop a wake-up,
so looking early and often would spend the CPU the loop exists to save; looking late adds
latency. Further looks follow every few percent of the estimate (25..200 us).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from stgcnd.log import get_logger
from stgcnd.server.executor import ExecutorBase, error_reply
from stgcnd.server.outbox import Reply
from stgcnd.server.scheduler import Job, Scheduler
from stgcnd_client.protocol import ErrorCode

log = get_logger(__name__)

RECHECK_FRACTION = 0.04
RECHECK_MIN_S = 25e-6
RECHECK_MAX_S = 200e-6
EARLIER = 0.995       # a batch done at the first look: look 0.5 % sooner next time
LATER = 1.045         # one that was not: 4.5 % later (equilibrium: 90 % done at first look)
INLINE_S = 20e-6      # batches expected within this are looked at again at once
MAX_LOOK_S = 5.0      # never plan a first look further out than this
BLOCKED_RETRY_S = 1e-3  # the runner cannot launch right now (another thread captures a graph)


class LoopExecutor(ExecutorBase):
    def __init__(self, model: Any, index: int, scheduler: Scheduler, buckets: Sequence[int],
                 lanes: int, warmup_runs: int,
                 on_fatal: Callable[[BaseException], None]) -> None:
        super().__init__(model, index, scheduler, buckets, lanes, warmup_runs, on_fatal)
        self.name = f"executor-{model.name}-{index}"
        self.runner: Any = None
        self.wall_s: dict[int, float] = {}     # bucket -> expected launch-to-done time
        self._attached = False
        self._closed = False
        self._jobs: list[Job] | None = None    # the batch in flight
        self._bucket = 0
        self._started = 0.0                    # monotonic, when it was launched
        self._looks = 0
        self.next_look: float | None = None

    # -- start-up, in the thread that starts the model -------------------------------------
    def prepare(self) -> None:
        runner = self._prepare_runner()
        self.wall_s = {b: ms / 1e3 for b, ms in runner.wall_ms.items()}
        self.runner = runner

    def hand_over(self) -> tuple[Any, dict[int, float], tuple[int, ...]]:
        """Give up the prepared runner, never attached to the loop, to an executor thread:
        (runner, warmed compute estimates, buckets). This executor is then closed."""
        assert not self._attached and self._jobs is None
        self._closed = True
        runner, self.runner = self.runner, None
        return runner, self.compute_ms, self.buckets

    # -- what the server asks of every executor --------------------------------------------
    def is_alive(self) -> bool:
        return not self._closed

    def join(self, timeout: float | None = None) -> None:
        """Nothing to join: the loop drives this executor (threaded executors' interface)."""

    def close(self) -> None:
        """Free the runner (waiting for a batch still on the device); idempotent."""
        if self._closed:
            return
        self._closed = True
        runner, self.runner = self.runner, None
        if runner is not None:
            if self._jobs is not None:
                runner.wait()
                self._jobs = None
            runner.close()

    def abandon(self, exc: Exception) -> list[Reply]:
        """After an error outside any batch (the daemon is then stopping): error replies for
        the batch in flight and, if no other executor of the model is left, for everything
        queued. The runner is not closed (the device may be unusable), only detached from
        this thread: a context pycuda pushed here must not outlive the thread (pycuda would
        abort the process at exit instead of letting it exit 1 for systemd)."""
        self._closed = True
        runner, self.runner = self.runner, None
        if runner is not None and self._attached:
            try:
                runner.detach()
            except Exception as err:  # the device is already failing; exit 1 regardless
                log.warning("runner_detach_failed", executor=self.name, error=str(err))
        jobs, self._jobs = self._jobs or [], None
        self.busy_since = None
        if not any(ex.is_alive() for ex in self.model.executors):
            jobs += self.scheduler.drain()
        message = (f"the executor failed ({type(exc).__name__}: {exc}); the daemon is "
                   "restarting, retry shortly")
        return [error_reply(j, ErrorCode.INTERNAL, message, "error") for j in jobs]

    # -- one turn of the I/O loop ----------------------------------------------------------
    def drive(self, now: float) -> tuple[list[Reply], float | None]:
        """Finish the batch in flight if the device is done, then launch the next.

        Returns the replies to send and when to look again (monotonic seconds; None: not
        before new work arrives)."""
        self.heartbeat = now
        replies: list[Reply] = []
        if self._closed:
            return replies, None
        if not self._attached:
            self.runner.attach()
            self._attached = True
        while True:
            if self._jobs is not None:
                if not self._finish_if_done(now, replies):
                    return replies, self.next_look
                now = time.monotonic()
            if not self.runner.can_launch():
                return replies, now + BLOCKED_RETRY_S
            jobs, wait_until = self.scheduler.take_now(self.runner.max_batch, now)
            if jobs is None:  # closed and drained
                self.close()
                return replies, None
            if not jobs:
                return replies, wait_until
            early, runnable = self._sort(jobs, now)
            replies.extend(early)
            if runnable:
                self._launch(runnable, now, replies)
                if self._jobs is not None and self.next_look is not None and \
                        self.next_look - now > INLINE_S:
                    return replies, self.next_look

    def _launch(self, jobs: list[Job], now: float, replies: list[Reply]) -> None:
        runner = self.runner
        self.busy_since = now
        try:
            runner.launch([j.window for j in jobs], [j.lane for j in jobs])
        except Exception as exc:
            self.busy_since = None
            replies.extend(self._failed(jobs, exc))
            return
        self._jobs = jobs
        self._started = now
        self._bucket = bucket = runner.bucket_for(len(jobs))
        self._looks = 0
        self.next_look = now + self.wall_s.get(bucket, 0.0)

    def _finish_if_done(self, now: float, replies: list[Reply]) -> bool:
        jobs = self._jobs
        assert jobs is not None
        runner = self.runner
        try:
            if not runner.done():
                # Passes of the loop for other reasons (requests, replies) look too, for free;
                # only the planned look that finds it running counts as a miss.
                if self.next_look is not None and now >= self.next_look:
                    self._looks += 1
                    est = self.wall_s.get(self._bucket, 0.0)
                    step = min(max(est * RECHECK_FRACTION, RECHECK_MIN_S), RECHECK_MAX_S)
                    self.next_look = now + step
                return False
            logits = runner.collect()
        except Exception as exc:
            replies.extend(self._failed(jobs, exc))
        else:
            self._learn(now)
            replies.extend(self._finished(runner, jobs, logits, self._started))
        self._jobs = None
        self.busy_since = None
        self.next_look = None
        return True

    def _learn(self, seen_done: float) -> None:
        """Keep the bucket's first look at about the 90th percentile of its finish times."""
        bucket = self._bucket
        est = self.wall_s.get(bucket, 0.0)
        if self._looks == 0:
            self.wall_s[bucket] = est * EARLIER
        else:
            # Far off (a seed from a cold warm-up, a slower device clock): jump half way to
            # what was seen instead of creeping up 4.5 % per batch.
            seen = seen_done - self._started
            self.wall_s[bucket] = min(max(est * LATER, (est + seen) / 2 if seen > 2 * est
                                          else 0), MAX_LOOK_S)
