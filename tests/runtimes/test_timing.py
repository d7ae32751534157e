"""The bench times its runners round-robin: every round calls each once, starting one further
along, so that a noisy stretch of a shared machine falls on all of them alike."""

from __future__ import annotations

import numpy as np

from stgcnd.runtimes.timing import time_round_robin


class Recorder:
    def __init__(self, name: str, calls: list[str], out: float) -> None:
        self.name, self.calls, self.out = name, calls, out
        self.last_timings = {"compute_ms": 1.0}

    def run(self, windows: list[np.ndarray]) -> np.ndarray:
        self.calls.append(self.name)
        return np.full((len(windows), 2), self.out, np.float32)


def test_each_round_calls_every_runner_once_in_a_rotated_order():
    calls: list[str] = []
    runners = [Recorder(n, calls, i) for i, n in enumerate("abc")]
    timed = time_round_robin(runners, np.zeros((2, 3, 4, 5, 1), np.float32), 3, warmup=1)
    assert calls[:3] == ["a", "b", "c"]                   # warm-up, in order
    assert calls[3:] == list("abc" "bca" "cab")           # rounds, rotated
    for i, (times, out, parts) in enumerate(timed):
        assert len(times) == 3 and all(t >= 0 for t in times)
        assert out.shape == (2, 2) and out[0, 0] == i     # each runner's own output
        assert parts == {"compute_ms": 1.0}
