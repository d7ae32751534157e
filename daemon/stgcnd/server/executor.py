"""An executor: one runner of a model, driven by the I/O loop (Triton's model instance).

The loop takes a batch from the scheduler when the executor is free, refuses jobs that cannot
finish in time (server/compute_estimate.py), launches the rest and finishes the batch on a
later pass: a worker-thread runner wakes the loop itself, a non-blocking one is looked at on
the loop's timer. `busy_since` is the only thing the watchdog trusts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stgcnd.errors import at_step
from stgcnd.log import get_logger
from stgcnd.runtimes.base import Runner, Runtime
from stgcnd.runtimes.cuda import CudaError
from stgcnd.server.compute_estimate import ComputeEstimate
from stgcnd.server.scheduler import Job, Scheduler
from stgcnd_client.protocol import ErrorCode, ProtocolError, Reason

log = get_logger(__name__)

RECHECK_FRACTION = 0.04
RECHECK_MIN_S = 25e-6
RECHECK_MAX_S = 200e-6
EARLIER = 0.995          # a batch done at the first look: look 0.5 % sooner next time
LATER = 1.045            # one that was not: 4.5 % later (equilibrium: 90 % done at first look)
INLINE_S = 20e-6         # batches expected within this are looked at again at once
MAX_LOOK_S = 5.0         # never plan a first look further out than this
BLOCKED_RETRY_S = 1e-3   # the runner cannot launch right now (another thread captures a graph)


@dataclass
class Reply:
    """A finished job's answer: its result, or the error its client gets. The request path
    (server/requests.py), which decoded the request, encodes it."""

    job: Job
    outcome: str                # "ok", "error", "expired", "shutting-down"
    result: dict[str, Any] | None = None   # ok: the prediction (probs, label, timings...)
    error: ProtocolError | None = None
    timings: dict[str, float] = field(default_factory=dict)


def error_reply(job: Job, code: ErrorCode, message: str, outcome: str) -> Reply:
    # A push job's frame is in its camera's window already: only the prediction failed.
    reason = Reason.STOPPING if code == ErrorCode.SHUTTING_DOWN else None
    return Reply(job, outcome, error=ProtocolError(
        code, message, reason=reason, appended=True if job.op == "push" else None))


def shutting_down(job: Job) -> Reply:
    return error_reply(job, ErrorCode.SHUTTING_DOWN,
                       "the daemon is shutting down; retry on its restart", "shutting-down")


def replies_for(jobs: Sequence[Job], logits: np.ndarray, labels: Sequence[str], model: str,
                started: float, timings: dict[str, float]) -> list[Reply]:
    """One reply per job from its row of the batch's logits, in plain floats: with a handful
    of classes numpy's per-call overhead, like round(x, 3)'s decimal text, costs more than this
    loop on the I/O loop. Softmax in double precision; ms rounded to whole microseconds."""
    out = []
    done = time.monotonic()
    exp = math.exp
    for job, row in zip(jobs, logits.tolist()):
        t = {**timings, "queue_ms": round((started - job.received) * 1e6) / 1e3,
             "total_ms": round((done - job.received) * 1e6) / 1e3}
        if not math.isfinite(sum(row)):  # float32 logits summed in double: finite if all are
            # Inputs of huge magnitude overflow float32 (or float16 engines) inside the
            # network: a NaN prediction must never reach a client as if it were one.
            refused = error_reply(job, ErrorCode.NON_FINITE, (
                "the model produced non-finite logits for this window (values too large for "
                "the network's precision); send normalized keypoints (x, y in 0..1 or "
                "pixels, visibility in 0..1)"), "error")
            refused.timings = t
            out.append(refused)
            continue
        top = max(row)
        exps = [exp(v - top) for v in row]
        total = sum(exps)
        label = row.index(top)  # the first of equal maxima, as numpy's argmax
        result = {**job.extra, "model": model, "logits": row,
                  "probs": [e / total for e in exps], "label": label,
                  "label_name": labels[label], "timings": t}
        out.append(Reply(job, "ok", result, timings=t))
    return out


# When to look: a runner whose compute runs on its own worker thread (runtimes.base.InWorker)
# wakes the loop itself when a batch is done. A runner that only enqueues device work (CUDA
# graphs, noop) is looked at on the loop's timer: each bucket has an estimate of launch-to-done
# time, seeded by the warm-up and then tracking the 90th percentile of where its batches finish
# (a batch done at the first look pulls it earlier by a little, one that needed another look
# pushes it later by nine times as much, so that about one batch in ten needs a second look; one
# far later jumps it half way there, undone when the next batch is done at the first look; and
# a batch done at the first look that computed in under half the time of the last batch that
# pushed the look later scales it down by as much: neither one slow batch nor a slow spell may
# delay every later reply). A look costs the loop a wake-up; looking late adds latency. Further
# looks follow every few percent of the estimate (25..200 us).
class Executor:
    def __init__(self, model: str, labels: Sequence[str], index: int, scheduler: Scheduler,
                 runner: Runner, on_fatal: Callable[[BaseException], None]) -> None:
        self.model = model
        self._on_fatal = on_fatal
        self.labels = tuple(labels)
        self.name = f"executor-{model}-{index}"
        self.scheduler = scheduler
        self.runner = runner
        self.buckets = runner.buckets
        self._max_batch = runner.max_batch
        # Batch size -> its bucket, looked up twice a batch (runner.bucket_for walks them).
        self._bucket_of = {n: runner.bucket_for(n) for n in range(1, self._max_batch + 1)}
        self.estimate = ComputeEstimate(runner.buckets, runner.compute_ms)
        self.wall_s = {b: ms / 1e3 for b, ms in runner.wall_ms.items()}
        self.busy_since: float | None = None
        self.drain_deadline: float | None = None   # set at shutdown
        self.batches = 0
        self.windows = 0
        self.next_look: float | None = None
        self._attached = False
        self.alive = True   # False once closed (an attribute: the loop reads it every pass)
        self._jobs: list[Job] | None = None    # the batch in flight
        self._bucket = 0
        self._started = 0.0                    # monotonic, when it was launched
        self._looks = 0
        self._probe = False                    # the batch in flight runs past its estimate
        self._jumped: dict[int, tuple[float, float]] = {}  # bucket -> first look (before, after)
        self._pushed_by_ms: dict[int, float] = {}  # bucket -> compute of the last batch that
        #                                            pushed its first look later

    @classmethod
    def prepare(cls, runtime: Runtime, model: str, labels: Sequence[str], index: int,
                scheduler: Scheduler, buckets: Sequence[int], lanes: int, warmup_runs: int,
                wake: Callable[[], None], on_fatal: Callable[[BaseException], None]
                ) -> Executor:
        """Make and warm a runner (every bucket, before READY; never on a request's path)."""
        with at_step("context"):
            runner = runtime.open_runner(buckets, lanes, name=f"exec{index}-{model}")
        try:
            with at_step("warm-up"):
                runner.warm_up(warmup_runs)
        except BaseException:
            runner.close()
            raise
        runner.set_waker(wake)
        return cls(model, labels, index, scheduler, runner, on_fatal)

    # -- what the server asks --------------------------------------------------------------
    @property
    def compute_ms(self) -> dict[int, float]:
        """bucket -> the compute estimate (ms) that `expired` is judged by."""
        return self.estimate.as_dict()

    def estimate_ms(self, n: int) -> float:
        """Expected compute time of a batch of n (its bucket's estimate)."""
        return self.estimate.ms(self.estimate.bucket_for(n))

    def close(self) -> None:
        """Free the runner (waiting for a batch still running); idempotent."""
        if not self.alive:
            return
        self.alive = False
        if self._jobs is not None:
            self.runner.wait()
            self._jobs = None
        self.runner.close()

    def close_quietly(self) -> None:
        """Out of service without touching the runner (the device may be unusable)."""
        self.alive = False

    def abandon(self, exc: BaseException, queued: Sequence[Job] = ()) -> list[Reply]:
        """After an error outside any batch (the daemon is then stopping): error replies for
        the batch in flight and `queued` (what the model's scheduler still held, when no
        other executor of the model is left). The runner is not closed: the device may be
        unusable."""
        self.alive = False
        jobs, self._jobs = [*(self._jobs or []), *queued], None
        self.busy_since = None
        message = (f"the executor failed ({type(exc).__name__}: {exc}); the daemon is "
                   "restarting, retry shortly")
        return [error_reply(j, ErrorCode.INTERNAL, message, "error") for j in jobs]

    # -- one turn of the I/O loop ----------------------------------------------------------
    def drive(self, now: float) -> tuple[list[Reply], float | None]:
        """Finish the batch in flight if it is done, then launch the next. Returns the
        replies to send and when to look again (monotonic seconds; None: not before new
        work arrives or the runner wakes the loop)."""
        replies: list[Reply] = []
        if not self.alive:
            return replies, None
        if not self._attached:
            self.runner.attach()
            self._attached = True
        scheduler = self.scheduler
        while True:
            if self._jobs is not None:
                if not self._finish_if_done(now, replies):
                    return replies, self.next_look
                now = time.monotonic()
            if not scheduler.pending and not scheduler.closed:
                return replies, None  # the common case after a batch: nothing more queued
            if not self.runner.can_launch():
                return replies, now + BLOCKED_RETRY_S
            jobs, wait_until = scheduler.take(self._max_batch, now)
            if jobs is None:  # closed and drained
                self.close()
                return replies, None
            if not jobs:
                return replies, wait_until
            early, runnable = self._sort(jobs, now)
            replies.extend(early)
            if runnable:
                self._launch(runnable, now, replies)
                if self._jobs is not None and (self.next_look is None
                                               or self.next_look - now > INLINE_S):
                    return replies, self.next_look

    def _sort(self, jobs: list[Job], now: float) -> tuple[list[Reply], list[Job]]:
        """(replies for jobs that must not run, the jobs to run)."""
        if self.drain_deadline is not None and now > self.drain_deadline:
            return [shutting_down(j) for j in jobs], []
        self._probe = False
        bucket = self._bucket_of[len(jobs)]  # the estimate's buckets are the runner's
        estimate_ms = self.estimate.ms(bucket)
        eta = now + estimate_ms / 1e3
        for j in jobs:  # a loop, not all(generator): no call per job on the common path
            if j.deadline is not None and eta > j.deadline:
                break
        else:
            return [], jobs  # every job can make it: the common case
        if self.estimate.probe_due(bucket, now):
            # The estimate has refused this bucket for a while and learnt nothing since:
            # run what can still make it (a deadline not yet passed), and let the batch
            # correct the estimate.
            self._probe = True
        else:
            self.estimate.refused(bucket, now)
        replies: list[Reply] = []
        runnable = []
        for job in jobs:
            if job.deadline is not None and (now >= job.deadline if self._probe
                                             else eta > job.deadline):
                replies.append(error_reply(job, ErrorCode.EXPIRED, _expired_message(
                    job, now, len(jobs), estimate_ms), "expired"))
            else:
                runnable.append(job)
        return replies, runnable

    def _launch(self, jobs: list[Job], now: float, replies: list[Reply]) -> None:
        self.busy_since = now
        try:
            if len(jobs) == 1:  # the common batch at low load: no list comprehensions
                job = jobs[0]
                self.runner.launch([job.window], [job.lane])
            else:
                self.runner.launch([j.window for j in jobs], [j.lane for j in jobs])
        except Exception as exc:
            self.busy_since = None
            replies.extend(self._failed(jobs, exc))
            return
        self._jobs = jobs
        self._started = now
        self._bucket = bucket = self._bucket_of[len(jobs)]
        self._looks = 0
        self.next_look = now + self.wall_s.get(bucket, 0.0) if not self.runner.blocking else None

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
            t = runner.last_timings
            compute_ms = t.get("compute_ms")
            compute_ms = float(t.get("total_ms", 0.0) if compute_ms is None else compute_ms)
            if not runner.blocking:  # else it wakes the loop when done
                self._learn(now, compute_ms)
            replies.extend(self._finished(jobs, logits, compute_ms))
        self._jobs = None
        self.busy_since = None
        self.next_look = None
        return True

    def _learn(self, seen_done: float, computed_ms: float) -> None:
        """Keep the bucket's first look at about the 90th percentile of its finish times."""
        bucket = self._bucket
        est = self.wall_s.get(bucket, 0.0)
        jumped = self._jumped.pop(bucket, None) if self._jumped else None
        if self._looks == 0:
            pushed_by_ms = self._pushed_by_ms.get(bucket, 0.0) if self._pushed_by_ms else 0.0
            if jumped is not None and jumped[1] == est:
                # The batch before jumped the look out, and this one was done at it: that one
                # was an outlier (one slow batch under CPU contention), not a slower device.
                # Back to where it was, or every later reply waits for the outlier's look.
                self.wall_s[bucket] = jumped[0]
            elif 0 < computed_ms < pushed_by_ms / 2:
                # The device is fast again after a slow spell that pushed the look out: scale
                # it down by as much (0.5 % a batch would take hundreds of late replies).
                self.wall_s[bucket] = est * computed_ms / pushed_by_ms
                del self._pushed_by_ms[bucket]
            else:
                self.wall_s[bucket] = est * EARLIER
        else:
            self._pushed_by_ms[bucket] = computed_ms
            # Far off (a seed from a cold warm-up, a slower device clock): jump half way to
            # what was seen instead of creeping up 4.5 % per batch.
            seen = seen_done - self._started
            if seen > 2 * est:
                self.wall_s[bucket] = min((est + seen) / 2, MAX_LOOK_S)
                self._jumped[bucket] = (est, self.wall_s[bucket])
            else:
                self.wall_s[bucket] = min(est * LATER, MAX_LOOK_S)

    def _failed(self, jobs: list[Job], exc: Exception) -> list[Reply]:
        log.error("batch_failed", model=self.model, batch=len(jobs),
                  error=f"{type(exc).__name__}: {exc}")
        if isinstance(exc, CudaError):
            self._on_fatal(exc)  # the device may be unusable: stop, exit 1, systemd restarts
        message = f"inference failed: {type(exc).__name__}: {exc}"
        return [error_reply(j, ErrorCode.INTERNAL, message, "error") for j in jobs]

    def _finished(self, jobs: list[Job], logits: np.ndarray, compute_ms: float) -> list[Reply]:
        bucket = self._bucket
        self.estimate.learn(bucket, compute_ms, probe=self._probe)
        self._probe = False
        self.batches += 1
        self.windows += (n := len(jobs))
        timings = {"compute_ms": round(compute_ms * 1e3) / 1e3, "batch": n, "bucket": bucket}
        return replies_for(jobs, logits, self.labels, self.model, self._started, timings)

    def stats(self) -> dict[str, object]:
        return {"alive": self.alive, "batches": self.batches, "windows": self.windows,
                "compute_ms": {str(b): round(v, 3) for b, v in sorted(self.compute_ms.items())},
                "probes": self.estimate.probes}


def _expired_message(job: Job, now: float, batch: int, estimate_ms: float) -> str:
    """Why a job was refused, in numbers and in no client's parameter names: the Python client
    says `timeout`, in seconds, and states the budget itself; the wire says `timeout_ms`."""
    return (f"deadline passed: {(now - job.received) * 1e3:.1f} ms in queue and a batch of "
            f"{batch} takes ~{estimate_ms:.1f} ms; allow more time or add capacity")
