"""Rules without bypass (issue #42, items 3 and 4): a pending start does not survive a silence;
a window the feed's health would call low-visibility or out-of-frame starts nothing (one
threshold for both); the times a start reports are those of the clock that decided it.
Scripted times (the camera's own `ts` where it matters), no waiting."""

from __future__ import annotations

import numpy as np

from stgcnd.server.config import EventsConfig, ServerConfig
from stgcnd.server.events import Events
from stgcnd.server.feed_health import FeedHealth, Gate
from stgcnd.telemetry.skeleton_quality import SkeletonQuality

LABELS = ("normal", "loitering")
HIGH = [0.05, 0.95]
SERVER = ServerConfig()


def watching(**keys: float) -> Events:
    events = Events()
    config = EventsConfig(**{"min_duration_s": 5.0, "ema_alpha": 1.0, **keys})
    events.configure({"m": (config, LABELS)}, now=0.0, wall=0.0,
                     gate=Gate(SERVER.visibility_threshold, SERVER.feed_enter))
    return events


def window(visibility: float = 0.9, scale: float = 1.0, t: int = 30) -> np.ndarray:
    """One person in every frame, joints spread over the image (x, y in 0.2..0.8 x scale)."""
    w = np.zeros((3, t, 33, 1), np.float32)
    w[0] = np.linspace(0.2, 0.8, 33)[None, :, None] * scale
    w[1] = np.linspace(0.3, 0.7, 33)[None, :, None] * scale
    w[2] = visibility
    return w


def test_a_pending_start_does_not_survive_a_minute_of_silence():
    events = watching()
    assert events.observe_window("cam", "m", HIGH, now=10.0, wall=1e9, window=window(),
                                 ts=1.0) == []
    # 60 s without a prediction on the camera's clock, then one window: the wait from 1 s
    # was never seen to hold; a new one begins.
    assert events.observe_window("cam", "m", HIGH, now=10.5, wall=1e9, window=window(),
                                 ts=61.0) == []
    # ... and completes once held, dated at its own beginning.
    (start,) = events.observe_window("cam", "m", HIGH, now=11.0, wall=1e9, window=window(),
                                     ts=66.0)
    assert (start["kind"], start["started"]) == ("start", 61.0)


def test_windows_closer_than_the_gap_keep_the_wait():
    events = watching()  # gap: max(exit_hold_s 1.5, event_idle_s 5.0)
    for ts in (1.0, 4.0):
        assert events.observe_window("cam", "m", HIGH, 0.0, 0.0, window(), ts=ts) == []
    (start,) = events.observe_window("cam", "m", HIGH, 0.0, 0.0, window(), ts=6.0)
    assert start["started"] == 1.0


def feed_state(w: np.ndarray) -> str:
    """What the feed's health says of a camera that sends only frames like `w`'s."""
    quality = SkeletonQuality(SERVER.visibility_threshold)
    health = FeedHealth()
    state = "ok"
    for interval in range(SERVER.feed_intervals):
        for frame in range(w.shape[1]):
            quality.add("cam", w[:, frame])
        records = quality.drain(["cam"])
        for change in health.update(records, float(interval), SERVER):
            state = str(change["state"])
    return state


def test_a_feed_said_low_visibility_starts_nothing():
    low = window(visibility=0.3)
    assert feed_state(low) == "low-visibility"
    events = watching(min_duration_s=0.0)
    assert events.observe_window("cam", "m", HIGH, 0.0, 0.0, low, ts=1.0) == []
    assert events.open_events() == 0
    seen = window(visibility=0.6)  # above the one threshold: the feed is ok, events start
    assert feed_state(seen) == "ok"
    assert [e["kind"] for e in events.observe_window("cam", "m", HIGH, 0.0, 0.0, seen,
                                                     ts=2.0)] == ["start"]


def test_a_feed_said_out_of_frame_starts_nothing_and_ends_an_open_event():
    pixels = window(scale=640.0)  # pixel coordinates: every visible joint out of 0..1
    assert feed_state(pixels) == "out-of-frame"
    events = watching(min_duration_s=0.0, exit_hold_s=1.0)
    assert events.observe_window("cam", "m", HIGH, 0.0, 0.0, pixels, ts=1.0) == []
    assert events.open_events() == 0
    events.observe_window("cam", "m", HIGH, 0.0, 0.0, window(), ts=2.0)
    assert events.open_events() == 1
    assert events.observe_window("cam", "m", HIGH, 0.0, 0.0, pixels, ts=2.5) == []
    (end,) = events.observe_window("cam", "m", HIGH, 0.0, 0.0, pixels, ts=3.5)
    assert (end["reason"], end["ended"]) == ("out-of-frame", 2.5)


def test_a_start_reports_the_wait_its_clock_held():
    # A loaded loop: `now` (monotonic, read at the pass's start) lags the wall clock read
    # for the pending window by 0.3 s and not for the deciding one. The start is decided on
    # `now` (5 s held), and must not report less.
    events = watching()
    events.observe("cam", "m", HIGH, now=100.0, wall=1000.3)
    (start,) = events.observe("cam", "m", HIGH, now=105.0, wall=1005.0)
    assert start["at"] - start["started"] >= 5.0
    assert start["started"] == 1000.0
