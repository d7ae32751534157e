"""The per-bucket compute estimate that `expired` is judged by, on its own (numbers in, numbers
out); tests/server/test_executor.py drives it through a real executor and runner."""

from __future__ import annotations

from stgcnd.server.compute_estimate import (
    PROBE_AFTER_REFUSALS,
    PROBE_MAX_WAIT_S,
    RECENT,
    ComputeEstimate,
)


def test_the_warm_up_seeds_each_bucket_and_an_unmeasured_one_refuses_nothing():
    est = ComputeEstimate((1, 2, 4), {1: 30.0, 2: 50.0})
    assert est.ms(1) == 30.0 and est.ms(2) == 50.0 and est.ms(4) == 0.0
    assert est.bucket_for(3) == 4 and est.bucket_for(9) == 4
    assert est.as_dict() == {1: 30.0, 2: 50.0}


def test_one_outlier_does_not_move_it_most_recent_batches_do():
    est = ComputeEstimate((1,), {1: 30.0})
    est.learn(1, 1400.0)
    assert est.ms(1) == 30.0           # the lower median of (30, 1400)
    for ms in (31.0, 29.0):
        est.learn(1, ms)
    assert est.ms(1) in (29.0, 30.0, 31.0)
    for _ in range(RECENT // 2 + 1):   # a slower device: most recent batches agree
        est.learn(1, 300.0)
    assert est.ms(1) == 300.0


def test_a_probe_is_due_after_refusals_spanning_a_few_estimates():
    est = ComputeEstimate((1,), {1: 100.0})
    assert not est.probe_due(1, 0.0)
    for i in range(PROBE_AFTER_REFUSALS):
        assert not est.probe_due(1, i * 0.01)
        est.refused(1, i * 0.01)
    assert not est.probe_due(1, 0.29)  # three refusals, but not 3 x 100 ms yet
    assert est.probe_due(1, 0.30)
    est.learn(1, 100.0)                # any batch of the bucket ends the refusing spell
    assert not est.probe_due(1, 10.0)


def test_an_absurd_estimate_waits_no_longer_than_the_cap():
    est = ComputeEstimate((1,), {1: 60_000.0})
    for _ in range(PROBE_AFTER_REFUSALS):
        est.refused(1, 0.0)
    assert est.probe_due(1, PROBE_MAX_WAIT_S)


def test_a_probe_starts_the_history_afresh():
    est = ComputeEstimate((1,), {1: 30.0})
    for _ in range(RECENT):
        est.learn(1, 500.0)
    est.learn(1, 30.0, probe=True)
    assert est.ms(1) == 30.0 and est.probes == 1
