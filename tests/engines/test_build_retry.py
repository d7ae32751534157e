"""When a failed build is tried again (engines/retry.py): 25% more free memory than when it
failed, or build_retry_after_s later, at most build_attempts times in all."""

from __future__ import annotations

from stgcnd.engines.retry import BuildRetry

MB = 1 << 20
FAILED = {"attempts": 1, "free_bytes": 2000 * MB, "failed_at_s": 1000.0}


def test_not_again_with_the_same_memory_soon_after():
    retry = BuildRetry(after_s=3600, attempts=3)
    assert retry.why_now(FAILED, 2400 * MB, now=1000.0 + 60) is None
    assert retry.when(FAILED) == {"retry_after": "1970-01-01T01:16:40Z",
                                  "retry_when_free_mb": 2500, "attempts": 1,
                                  "max_attempts": 3}


def test_again_with_a_quarter_more_memory_or_after_the_time():
    retry = BuildRetry(after_s=3600, attempts=3)
    assert "2500 MB free now" in (retry.why_now(FAILED, 2500 * MB, now=1060.0) or "")
    assert retry.why_now(FAILED, None, now=1000.0 + 3600) is not None


def test_never_past_the_attempts():
    retry = BuildRetry(after_s=0, attempts=2)
    spent = {**FAILED, "attempts": 2}
    assert retry.why_now(spent, 10_000 * MB, now=1e9) is None
    assert retry.when(spent) == {} and "the most build_attempts allows" in retry.describe(spent)
