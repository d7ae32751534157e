"""How long a batch will compute, per bucket (what the executor refuses `expired` jobs by):
the lower median of its recent batches; a bucket that refused everything for a while runs one
batch anyway as a probe, or a wrong estimate would never be corrected. I/O loop only."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RECENT = 5                   # batches per bucket the estimate is the lower median of
PROBE_AFTER_REFUSALS = 3     # refused batches before a probe (one refusal says little)
PROBE_AFTER_ESTIMATES = 3.0  # ... spanning this many of the bucket's estimates
PROBE_MAX_WAIT_S = 2.0       # ... or this long, if less (an absurd estimate waits no longer)


@dataclass
class _Refusing:
    """A bucket refusing jobs with no batch of it run since `since` (monotonic seconds)."""

    since: float
    batches: int = 0


# An executor refuses a job when now + its batch's estimated compute time passes the job's
# deadline. That estimate can go wrong in two ways, each of which once refused a camera for good:
#
# - **One outlier captures it.** An average (an EWMA) moved a fifth of the way to one 1.4 s batch
#   (CPU contention), and every camera whose deadline was shorter was refused until enough normal
#   batches pulled it back. Here the estimate is the *lower median* of the bucket's last
#   `RECENT` batches (seeded by the warm-up): one slow batch among normal ones does not move it;
#   it moves once most recent batches agree.
# - **It goes stale.** An estimate learns only from batches that run, and a high estimate refuses
#   the very batches that would correct it: nothing runs, so nothing corrects it. So once a
#   bucket's estimate has refused jobs `PROBE_AFTER_REFUSALS` times, for `PROBE_AFTER_ESTIMATES`
#   of its own estimates' time (at most `PROBE_MAX_WAIT_S`), without a batch of that bucket run
#   since, the next batch it would refuse runs anyway: a *probe*. A probe starts the bucket's
#   history afresh with what it measured (what it replaces described a past the probe has just
#   contradicted or confirmed). The cost is bounded: at most one batch run past its estimate per
#   few estimates' time, per bucket, and only while that bucket refuses everything.
class ComputeEstimate:
    def __init__(self, buckets: Sequence[int], warmed_ms: Mapping[int, float]) -> None:
        self.buckets = tuple(buckets)
        self._recent = {b: deque([float(warmed_ms[b])], maxlen=RECENT)
                        for b in self.buckets if b in warmed_ms}
        # Each bucket's lower median, made when a batch is learnt: read once a batch.
        self._ms = {b: float(warmed_ms[b]) for b in self._recent}
        self._refusing: dict[int, _Refusing] = {}
        self.probes = 0

    def bucket_for(self, n: int) -> int:
        """The smallest bucket that holds n jobs (the largest, if none does)."""
        return next((b for b in self.buckets if b >= n), self.buckets[-1])

    def ms(self, bucket: int) -> float:
        """The bucket's estimate: the lower median of its recent batches (0: never measured,
        so nothing is refused by it)."""
        return self._ms.get(bucket, 0.0)

    def as_dict(self) -> dict[int, float]:
        return {b: self.ms(b) for b in self._recent}

    def refused(self, bucket: int, now: float) -> None:
        """Note a batch of which this bucket's estimate refused jobs."""
        state = self._refusing.get(bucket)
        if state is None:
            state = self._refusing[bucket] = _Refusing(now)
        state.batches += 1

    def probe_due(self, bucket: int, now: float) -> bool:
        """Whether this bucket has refused long enough without learning that its next batch
        should run anyway (see the comment above ComputeEstimate)."""
        state = self._refusing.get(bucket)
        if state is None or state.batches < PROBE_AFTER_REFUSALS:
            return False
        wait = min(PROBE_AFTER_ESTIMATES * self.ms(bucket) / 1e3, PROBE_MAX_WAIT_S)
        return now - state.since >= wait

    def learn(self, bucket: int, compute_ms: float, probe: bool = False) -> None:
        """A batch of this bucket finished, taking compute_ms."""
        if self._refusing:
            self._refusing.pop(bucket, None)
        recent = self._recent.get(bucket)
        if recent is None:
            recent = self._recent[bucket] = deque(maxlen=RECENT)
        if probe:
            self.probes += 1
            recent.clear()
        recent.append(float(compute_ms))
        self._ms[bucket] = sorted(recent)[(len(recent) - 1) // 2]
