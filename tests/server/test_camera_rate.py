"""A model too slow for its cameras' stride is named at start (camera_rate_at_risk)."""

from __future__ import annotations

from stgcnd.server.config import ModelConfig
from stgcnd.server.models import FRAMES_PER_S, camera_rate_at_risk


def test_a_window_slower_than_stride_frames_is_at_risk():
    mc = ModelConfig(name="m", demo=True, stride=1)
    risk = camera_rate_at_risk(mc, {1: 250.0, 8: 900.0})
    assert risk["budget_ms"] == 1e3 / FRAMES_PER_S and risk["compute_ms"] == 250.0
    assert "stride to at least 7" in str(risk["hint"])   # 250 ms = 6.25 frames at 25 fps


def test_a_stride_that_keeps_up_is_quiet():
    assert camera_rate_at_risk(ModelConfig(name="m", demo=True, stride=25), {1: 250.0}) == {}
    assert camera_rate_at_risk(ModelConfig(name="m", demo=True, stride=1), {}) == {}
