"""What an event's times mean (docs/protocol.md, "Events"; issue #32, items 8.8 and 8.9): the
id's milliseconds are `started`'s, and `ended` is when the event ended, not when the daemon
noticed: an idle camera's events end at its last prediction. Scripted times, no clock."""

from __future__ import annotations

import random

from stgcnd.server.config import EventsConfig
from stgcnd.server.events import Events

LABELS = ("normal", "shoplifting")


def watching(exit_hold_s: float = 0.0) -> Events:
    events = Events()
    config = EventsConfig(min_duration_s=0.0, exit_hold_s=exit_hold_s)
    events.configure({"m": (config, LABELS)}, now=0.0, wall=0.0)
    return events


def test_the_ids_milliseconds_are_starteds():
    rng = random.Random(8)
    for n in range(500):
        events = watching()
        wall = 1_700_000_000 + rng.uniform(0, 1e6)
        (start,) = events.observe(f"cam{n}", "m", [0.1, 0.9], now=1.0, wall=wall)
        ms = int(start["id"].rsplit("/", 1)[1])
        assert ms == round(start["started"] * 1000), (wall, start)
        assert abs(start["started"] - wall) <= 0.0005 + 1e-6


def test_an_idle_cameras_event_ends_at_its_last_prediction():
    events = watching()
    for t in range(5):  # active from t=0 to its last prediction at t=4
        events.observe("door", "m", [0.1, 0.9], now=float(t), wall=1000.0 + t)
    (end,) = events.forget("door", now=305.0, wall=1305.0, reason="camera-idle")
    assert (end["reason"], end["started"], end["ended"]) == ("camera-idle", 1000.0, 1004.0)
    assert end["duration_s"] == 4.0 and end["at"] == 1305.0  # said when noticed


def test_other_ends_are_dated_when_they_happen():
    events = watching()
    for t in range(3):
        events.observe("door", "m", [0.1, 0.9], now=float(t), wall=1000.25 + t)
    (low,) = events.observe("door", "m", [1.0, 0.0], now=3.0, wall=1003.25)  # EMA 0.45
    assert (low["reason"], low["ended"], low["at"]) == ("below-exit", 1003.25, 1003.25)
    events.observe("yard", "m", [0.1, 0.9], now=4.0, wall=1004.0)
    (stop,) = events.close_all(now=9.0, wall=1009.0, reason="shutdown")
    assert (stop["ended"], stop["duration_s"]) == (1009.0, 5.0)


def test_duration_is_ended_minus_started_exactly():
    events = watching()
    events.observe("c", "m", [0.1, 0.9], now=0.0, wall=1000.0004)
    (end,) = events.close_all(now=1.0, wall=1001.2346, reason="shutdown")
    assert end["duration_s"] == round(end["ended"] - end["started"], 3) == 1.235
