"""Per-(camera, model) latency aggregation in bounded memory: log-bucketed histograms
(LogHistogram) whose percentiles are within a set relative error; `max_ms` is exact."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OUTCOMES = ("ok", "error", "busy", "expired")
PERCENTILES = (50, 90, 95, 99)
STAGE_PERCENTILES = (50, 99)

DEFAULT_RELATIVE_ERROR = 0.01
MIN_MS = 1e-3  # 1 us: anything faster is reported as 1 us
MAX_MS = 1e7  # ~2.8 h: a request slower than that is a hang, not a latency
# Stage names are caller-chosen; cap them so a bug upstream cannot grow memory without bound.
MAX_STAGES_PER_KEY = 16
# Values a histogram holds before it buckets them (LogHistogram.pending), ~8 KB: a camera at
# 25 Hz fills it in 10 s, so mostly the stats interval's drain buckets them.
FOLD_AT = 256


# A value x > 0 falls in bucket ``ceil(log(x) / log(gamma))``, ``gamma = (1 + a) / (1 - a)``,
# reported as ``2 * gamma**i / (gamma + 1)``: within ``a`` of every value in it, whatever the
# distribution. Values are clamped to [MIN_MS, MAX_MS], so at most ``bucket_limit()`` buckets
# exist (about 1,400 for a = 1%). The p-th percentile of n samples is the one of rank
# ``floor(p/100 * (n-1))`` (0-based) in sorted order, numpy's ``method="lower"``.
class LogHistogram:
    """Bounded-memory quantile sketch with a guaranteed relative error."""

    __slots__ = ("_buckets", "_count", "_log_gamma", "_max", "_min", "gamma", "pending",
                 "relative_error")

    def __init__(self, relative_error: float = DEFAULT_RELATIVE_ERROR) -> None:
        if not 0 < relative_error < 1:
            raise ValueError("relative_error must be in (0, 1)")
        self.relative_error = relative_error
        self.gamma = (1 + relative_error) / (1 - relative_error)
        self._log_gamma = math.log(self.gamma)
        self._buckets: dict[int, int] = {}
        self._count = 0
        self._max = -math.inf
        self._min = math.inf
        # Not bucketed yet: an append a request (record), a few numpy calls a FOLD_AT of them.
        self.pending: list[float] = []

    def bucket_limit(self) -> int:
        """Most buckets this histogram can ever hold."""
        return math.ceil(math.log(MAX_MS) / self._log_gamma) - math.ceil(
            math.log(MIN_MS) / self._log_gamma) + 1

    def add(self, value_ms: float) -> None:
        self.pending.append(value_ms)
        if len(self.pending) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Bucket the pending values (NaN is dropped, values beyond the range clamped)."""
        if not self.pending:
            return
        values = np.array(self.pending, dtype=np.float64)
        self.pending = []
        values = values[~np.isnan(values)]
        if not values.size:
            return
        self._count += int(values.size)
        self._max = max(self._max, float(values.max()))
        self._min = min(self._min, float(values.min()))
        index = np.ceil(np.log(values.clip(MIN_MS, MAX_MS)) / self._log_gamma).astype(np.int64)
        for i, n in zip(*(a.tolist() for a in np.unique(index, return_counts=True))):
            self._buckets[i] = self._buckets.get(i, 0) + n

    # Readers bucket the pending values first: they count too.
    @property
    def count(self) -> int:
        self.fold()
        return self._count

    @property
    def max(self) -> float:
        self.fold()
        return self._max

    @property
    def min(self) -> float:
        self.fold()
        return self._min

    @property
    def bucket_count(self) -> int:
        self.fold()
        return len(self._buckets)

    def quantiles(self, percents: Iterable[float]) -> list[float | None]:
        """Percentiles (0-100) in one pass over the sorted buckets."""
        self.fold()
        wanted = sorted((p, i) for i, p in enumerate(percents))
        out: list[float | None] = [None] * len(wanted)
        if self._count == 0 or not wanted:
            return out
        ranks = [(math.floor(p / 100 * (self._count - 1)), i) for p, i in wanted]
        seen = 0
        pos = 0
        wanted_n = len(ranks)  # the loop below runs once per bucket: ~1,400 a histogram
        buckets = self._buckets
        next_rank = ranks[0][0]
        for index in sorted(buckets):
            seen += buckets[index]
            if next_rank >= seen:
                continue
            while pos < wanted_n and ranks[pos][0] < seen:
                value = 2 * self.gamma**index / (self.gamma + 1)
                # The exact extremes are known; never report beyond them.
                out[ranks[pos][1]] = min(max(value, self._min), self._max)
                pos += 1
            if pos == wanted_n:
                break
            next_rank = ranks[pos][0]
        return out


@dataclass
class _KeyStats:
    relative_error: float
    total: LogHistogram = field(init=False)
    stages: dict[str, LogHistogram] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    timed: list[dict[str, float]] = field(default_factory=list)  # ok replies', not copied
    named: tuple[str, ...] | None = None  # the stages of `timed` kept (None: all), per fold

    def __post_init__(self) -> None:
        self.total = LogHistogram(self.relative_error)

    def fold(self) -> None:
        """Split the timings kept into their stages; bucket every histogram's values."""
        timed, self.timed = self.timed, []
        named = self.named if self.named is not None else {k: 0 for t in timed for k in t}
        for name in named if timed else ():
            values = [v for v in [t.get(name) for t in timed] if v is not None]
            hist = self.stages.get(name)
            if hist is None and values and len(self.stages) < MAX_STAGES_PER_KEY:
                hist = self.stages[name] = LogHistogram(self.relative_error)
            if hist is not None:
                hist.pending += values
        for hist in (self.total, *self.stages.values()):
            hist.fold()


class LatencyAggregator:
    """Per-(camera, model) latency statistics of the I/O loop, drained once per stats interval.

    ``record`` is O(1): a few appends; ``drain`` returns one record per (camera, model) seen
    since the previous drain and starts a new interval.
    Percentiles cover ``ok`` replies only (error/busy/expired replies are counted, not timed:
    a fast rejection would otherwise make a saturated camera look quick)."""

    def __init__(self, relative_error: float = DEFAULT_RELATIVE_ERROR) -> None:
        self.relative_error = relative_error
        self._stats: dict[tuple[str, str], _KeyStats] = {}

    def record(self, camera: str, model: str, total_ms: float, outcome: str = "ok",
               timings: dict[str, float] | None = None, stages: tuple[str, ...] | None = None
               ) -> None:
        """Count one reply; time it when ok. `timings`: stage name -> ms; `stages`: record
        only these of its keys (the caller's reply timings, kept without copying them)."""
        stats = self._stats.get((camera, model))
        if stats is None:  # a new key, or one of a non-string camera id (kept as a string)
            key = (str(camera), str(model))
            stats = self._stats.setdefault(key, _KeyStats(self.relative_error))
        if outcome != "ok":
            if outcome not in OUTCOMES:
                raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
            stats.outcomes[outcome] += 1
            return
        stats.outcomes["ok"] += 1
        (pending := stats.total.pending).append(total_ms)
        if timings:
            if stages is not stats.named:  # other stages than those kept so far
                stats.fold()
                stats.named = stages
            stats.timed.append(timings)
        if len(pending) >= FOLD_AT:
            stats.fold()

    def drain(self, interval_s: float) -> list[dict[str, Any]]:
        """One dict per active (camera, model), ready for ``log.info("latency", **record)``."""
        drained, self._stats = self._stats, {}
        return [_to_record(camera, model, stats, interval_s)
                for (camera, model), stats in sorted(drained.items())]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _to_record(camera: str, model: str, stats: _KeyStats, interval_s: float) -> dict[str, Any]:
    stats.fold()
    count = sum(stats.outcomes.values())
    hist = stats.total
    p50, p90, p95, p99 = hist.quantiles(PERCENTILES)
    record: dict[str, Any] = {
        "camera": camera, "model": model, "count": count, "ok": stats.outcomes["ok"],
        "rate_hz": round(count / interval_s, 3) if interval_s > 0 else None,
        "p50_ms": _round(p50), "p90_ms": _round(p90), "p95_ms": _round(p95),
        "p99_ms": _round(p99), "max_ms": _round(hist.max) if hist.count else None,
        "errors": stats.outcomes["error"], "busy": stats.outcomes["busy"],
        "expired": stats.outcomes["expired"], "interval_s": round(interval_s, 3),
    }
    for name in sorted(stats.stages):
        s50, s99 = stats.stages[name].quantiles(STAGE_PERCENTILES)
        prefix = name[:-3] if name.endswith("_ms") else name
        record[f"{prefix}_p50_ms"] = _round(s50)
        record[f"{prefix}_p99_ms"] = _round(s99)
    return record
