"""Timing runners against each other: the one measurement behind `backend = "auto"`'s choice
and `stgcnd bench`.

Each round calls every runner once, starting one further along each round, so that a busy
stretch of a shared machine falls on all of them alike instead of on whichever ran then; the
minimum over rounds is then the fairest figure of each."""

from __future__ import annotations

import time
from typing import Dict, List, Tuple

import numpy as np

from stgcnd.runtimes.base import Runner

# typing's generics: an alias is evaluated at run time, and 3.8 has no tuple[...]
Timed = Tuple[List[float], np.ndarray, Dict[str, float]]


def time_round_robin(runners: list[Runner], x: np.ndarray, rounds: int, warmup: int
                     ) -> list[Timed]:
    """Per runner: its call latencies (ms), its last output, the medians of its own timings
    (`compute_ms`); `x` is the batch of windows every call runs."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    windows = list(x)
    for runner in runners:
        for _ in range(warmup):
            runner.run(windows)
    times: list[list[float]] = [[] for _ in runners]
    parts: list[dict[str, list[float]]] = [{} for _ in runners]
    outs: list[np.ndarray | None] = [None] * len(runners)
    for i in range(rounds):
        for k in range(len(runners)):
            j = (i + k) % len(runners)
            t0 = time.perf_counter()
            outs[j] = runners[j].run(windows)
            times[j].append((time.perf_counter() - t0) * 1e3)
            if "compute_ms" in runners[j].last_timings:
                parts[j].setdefault("compute_ms", []).append(
                    runners[j].last_timings["compute_ms"])
    done = [o for o in outs if o is not None]
    return [(t, o, {k: float(np.median(v)) for k, v in p.items()})
            for t, o, p in zip(times, done, parts)]
