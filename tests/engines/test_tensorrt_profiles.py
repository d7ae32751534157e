"""TensorRT build bookkeeping that needs no TensorRT: batch buckets and their optimization
profiles, calibration batching, and the calibration cache's name."""

from __future__ import annotations

import pytest

from stgcnd.engines.builders.tensorrt import (
    bucket_profiles,
    calibration_batching,
    calibration_cache_name,
)
from stgcnd.engines.options import BuildOptions
from stgcnd.errors import UserError
from stgcnd.runtimes.base import normalize_buckets
from stgcnd.runtimes.tensorrt_runtime import plan_contexts


def batch_buckets(max_batch, buckets=None):
    """The buckets an engine is built with: the model's, cut by max_batch (serving_plan)."""
    given = {} if buckets is None else {"buckets": buckets}
    return BuildOptions(max_batch=max_batch, **given).buckets


@pytest.mark.parametrize(("max_batch", "given", "buckets"), [
    (1, None, (1,)), (2, None, (1, 2)), (6, None, (1, 2, 4, 6)), (8, None, (1, 2, 4, 8)),
    (9, None, (1, 2, 4, 8, 9)), (16, None, (1, 2, 4, 8, 12, 16)),
    (64, (12, 24, 48), (1, 12, 24, 48)), (16, (4,), (1, 4)),
])
def test_buckets(max_batch, given, buckets):
    assert batch_buckets(max_batch, given) == buckets


def test_one_profile_per_bucket_covers_every_batch_once():
    for max_batch in range(1, 40):
        buckets = batch_buckets(max_batch)
        profiles = bucket_profiles(buckets)
        assert len(profiles) == len(buckets)
        assert [opt for _low, opt, _high in profiles] == list(buckets)  # tuned at the bucket
        covered = [b for low, _opt, high in profiles for b in range(low, high + 1)]
        assert covered == list(range(1, max_batch + 1))  # disjoint, no gaps
        assert all(low <= opt == high for low, opt, high in profiles)


def test_runner_buckets_map_onto_the_built_profiles():
    """The daemon asks for its own buckets; each lands on a distinct profile of the engine."""
    profiles = bucket_profiles(batch_buckets(8))
    for asked in [(1, 2, 4, 8), (1, 8), (1, 3, 5, 8), (1, 2, 3, 4, 5, 6, 7, 8)]:
        plan = plan_contexts(normalize_buckets(asked, 8), profiles, dynamic=True)
        assert plan.per_bucket
        assert len(set(plan.profiles.values())) == len(plan.profiles)
        assert set(plan.buckets) <= set(batch_buckets(8))
        for b in asked:  # every batch size the scheduler may form has a bucket that holds it
            assert any(bucket >= b for bucket in plan.buckets)
    # The model's own buckets are the profiles built: each is served as itself.
    built = batch_buckets(64, (1, 12, 24, 48))
    plan = plan_contexts(built, bucket_profiles(built), dynamic=True)
    assert plan.buckets == built == (1, 12, 24, 48)


@pytest.mark.parametrize(("windows", "max_batch", "dynamic", "expected"), [
    (100, 8, True, (8, 12)),
    (3, 8, True, (3, 1)),       # fewer windows than a batch: one smaller batch, not zero
    (1, 8, True, (1, 1)),
    (5, 8, False, (1, 5)),      # a static batch-1 engine calibrates one window at a time
])
def test_calibration_batching(windows, max_batch, dynamic, expected):
    assert calibration_batching(windows, max_batch, dynamic) == expected


def test_calibration_batching_refuses_no_windows():
    with pytest.raises(UserError, match="at least one window"):
        calibration_batching(0, 8, True)


def test_calibration_cache_name_follows_the_onnx_content(tmp_path):
    from stgcnd.fsutil import file_sha256

    model = tmp_path / "model-dynamic.onnx"  # same file name, re-exported with new weights
    model.write_bytes(b"first export")
    first = calibration_cache_name("10.3.0", file_sha256(model), "c" * 64, 8)
    model.write_bytes(b"second export")
    second = calibration_cache_name("10.3.0", file_sha256(model), "c" * 64, 8)
    assert first != second
    assert first.startswith("tensorrt-10.3.0-onnx") and first.endswith("-b8.cache")
    assert calibration_cache_name("10.3.0", "a" * 64, "c" * 64, 4) != \
        calibration_cache_name("10.3.0", "a" * 64, "c" * 64, 8)
    assert calibration_cache_name("10.3.0", "a" * 64, "synthetic", 1).count("synthetic") == 1
