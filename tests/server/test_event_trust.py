"""Events a site can trust (issue #34): a window nobody is in starts no event and feeds no
smoothing; one dropout window does not end an event (the exit hold), and a camera gone
silent has its events ended in seconds, dated at its last prediction. Scripted times
through `Events`, and a real daemon for the request path and the loop's check."""

from __future__ import annotations

import time

import numpy as np

from stgcnd.server.cameras import CameraState
from stgcnd.server.config import EventsConfig
from stgcnd.server.events import Events, usable_share
from stgcnd_client import Client
from tests.server.daemon_harness import Daemon, stop_by_pid
from tests.server.test_events import NOOP_EVENTS

LABELS = ("normal", "shoplifting")
NOBODY, SOMEBODY = 0.0, 1.0   # usable shares


def watching(**rules: float) -> Events:
    events = Events()
    events.configure({"m": (EventsConfig(**rules), LABELS)}, now=0.0, wall=1000.0)
    return events


def feed(events: Events, sequence, start: float = 0.0, camera: str = "cam1",
         usable=SOMEBODY) -> list[dict]:
    """P(shoplifting) one a second from `start`; `usable`: one share for all, or one each."""
    shares = usable if isinstance(usable, list) else [usable] * len(sequence)
    out = []
    for i, (p, share) in enumerate(zip(sequence, shares)):
        t = start + i
        out += events.observe(camera, "m", [1.0 - p, p], now=t, wall=1000.0 + t,
                              usable=share)
    return out


def window(visibility: float, frames: int = 10, persons: int = 1) -> np.ndarray:
    w = np.zeros((3, frames, 33, persons), np.float32)
    w[:2, :, :, 0] = 0.5
    w[2, :, :, 0] = visibility
    return w


def test_the_usable_share_counts_frames_with_a_person_seen():
    assert usable_share(window(0.0), 0.3) == 0.0          # every keypoint invisible
    assert usable_share(window(0.9), 0.3) == 1.0
    assert usable_share(window(0.2), 0.3) == 0.0          # a person too faint to judge
    assert usable_share(window(0.9, persons=3), 0.3) == 1.0   # empty slots do not matter
    half = window(0.9)
    half[2, 5:] = 0.0                                     # the person left halfway through
    assert usable_share(half, 0.3) == 0.5


def test_windows_nobody_is_in_start_no_event():
    events = watching(min_duration_s=0.0)
    assert feed(events, [0.95] * 10, usable=NOBODY) == []
    assert events.open_events() == 0
    # Half the frames with a person is the default floor (min_usable 0.5): enough.
    (start,) = feed(events, [0.95], start=10.0, usable=0.5)
    assert start["kind"] == "start"


def test_windows_nobody_is_in_feed_no_smoothing_and_break_a_pending_start():
    events = watching(min_duration_s=2.0)
    # High at t=0, 1; nobody at t=2 (whatever the model says); high again from t=3: the
    # pending start begins again at t=3, so the event starts at t=5, dated t=3.
    out = feed(events, [0.95, 0.95, 0.0, 0.95, 0.95, 0.95],
               usable=[SOMEBODY, SOMEBODY, NOBODY, SOMEBODY, SOMEBODY, SOMEBODY])
    (start,) = out
    assert (start["started"], start["at"]) == (1003.0, 1005.0)
    # Nobody's windows leave the smoothed probability where it was (0.95 stays 0.95).
    assert feed(events, [0.0] * 1, start=6.0, usable=NOBODY) == []
    (end,) = events.close_all(now=7.0, wall=1007.0, reason="shutdown")
    assert end["probability"] == 0.95


def test_people_leaving_end_an_open_event_after_the_hold_with_reason_no_person():
    events = watching(min_duration_s=0.0)                 # exit_hold_s: 1.5 by default
    assert [e["kind"] for e in feed(events, [0.95] * 5)] == ["start"]
    assert feed(events, [0.95], start=5.0, usable=NOBODY) == []      # t=5: the hold begins
    assert feed(events, [0.95], start=6.0, usable=NOBODY) == []      # 1 s < 1.5 s
    (end,) = feed(events, [0.95], start=7.0, usable=NOBODY)
    assert (end["reason"], end["ended"], end["at"]) == ("no-person", 1005.0, 1007.0)
    assert end["duration_s"] == 5.0


def test_one_or_two_dropout_windows_do_not_end_an_event():
    """The integrator's case: one strong dropout ended the event, and the 30 s cooldown then
    hid the activity that went on. Now the event runs on, and ends where the activity does."""
    for dropout in ([0.0], [0.0, 0.0]):
        events = watching()                                # every default: cooldown 30 s
        sequence = [0.95] * 5 + dropout + [0.95] * 20 + [0.0] * 3
        out = feed(events, sequence)
        assert [e["kind"] for e in out] == ["start", "end"], dropout
        end = out[1]
        fall = 5 + len(dropout) + 20                       # the first of the last zeros
        assert (end["reason"], end["ended"], end["at"]) == (
            "below-exit", 1000.0 + fall, 1000.0 + fall + 2), dropout


def test_three_dropout_windows_end_it_and_the_cooldown_counts_from_the_end():
    events = watching(cooldown_s=10.0)
    out = feed(events, [0.95] * 5 + [0.0] * 3 + [0.95] * 20)
    assert [e["kind"] for e in out] == ["start", "end", "start"]
    end, again = out[1], out[2]
    assert (end["ended"], end["at"]) == (1005.0, 1007.0)   # dated at the fall, said at 7
    # Hold then cooldown: no start before the end's message plus cooldown_s (t=17).
    assert again["started"] == 1017.0 and again["at"] == 1019.0


def test_a_silent_camera_s_events_end_dated_at_its_last_prediction():
    events = watching(min_duration_s=0.0)                  # event_idle_s: 5 by default
    feed(events, [0.95] * 4)                               # cam1: last prediction at t=3
    feed(events, [0.95] * 8, camera="cam2")                # cam2 goes on to t=7
    table = {"cam1": CameraState("cam1", 0, last_activity=3.0),
             "cam2": CameraState("cam2", 1, last_activity=7.0)}
    assert events.expire_silent(now=7.9, wall=1007.9, cameras=table) == []
    (end,) = events.expire_silent(now=8.0, wall=1008.0, cameras=table)
    assert (end["camera"], end["reason"]) == ("cam1", "camera-silent")
    assert (end["ended"], end["duration_s"], end["at"]) == (1003.0, 3.0, 1008.0)
    assert events.expire_silent(now=8.5, wall=1008.5, cameras=table) == []   # ended once
    assert events.open_events() == 1                       # cam2's is open still


def test_a_camera_still_sending_keeps_its_events_while_predictions_lag():
    """An overloaded daemon (or a long stride) answers a camera's windows seconds apart: the
    camera is not silent while its requests arrive, and its event stays open."""
    events = watching(min_duration_s=0.0)
    feed(events, [0.95] * 4)                               # last prediction at t=3
    table = {"cam1": CameraState("cam1", 0, last_activity=9.5)}   # frames until t=9.5
    assert events.expire_silent(now=14.0, wall=1014.0, cameras=table) == []
    (end,) = events.expire_silent(now=14.5, wall=1014.5, cameras=table)
    assert (end["reason"], end["ended"]) == ("camera-silent", 1003.0)


def test_a_reload_applies_the_hold_and_the_floor_at_once():
    events = watching(min_duration_s=0.0)
    feed(events, [0.95] * 3)
    now_strict = EventsConfig(min_duration_s=0.0, exit_hold_s=0.0, min_usable=1.0)
    assert events.configure({"m": (now_strict, LABELS)}, now=3.0, wall=1003.0) == []
    (end,) = feed(events, [0.95], start=4.0, usable=0.9)   # 0.9 < 1.0: nobody, no hold
    assert (end["reason"], end["ended"]) == ("no-person", 1004.0)


def test_the_daemon_starts_no_event_for_nobody_and_ends_a_silent_cameras(tmp_path):
    """The noop model's P(shoplifting) is 0.5 on every window, at enter: a window with a
    person starts an event, the same window with every keypoint invisible starts none; the
    camera then silent, its event ends (camera-silent) at its one prediction."""
    d = Daemon(tmp_path, models=NOOP_EVENTS.format(exit=0.4) + "event_idle_s = 1.0\n")
    d.start()
    try:
        with Client(d.endpoint, camera_id="nobody") as nobody:
            for _ in range(3):
                nobody.infer(window(0.0, frames=30))
        with Client(d.endpoint, camera_id="somebody") as somebody:
            somebody.infer(window(0.9, frames=30))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                e.get("event") == "action_event" and e["kind"] == "end"
                for e in d.log_events()):
            time.sleep(0.1)
        assert d.stop() == 0
    finally:
        stop_by_pid(d)
    events = [e for e in d.log_events() if e.get("event") == "action_event"]
    assert [(e["camera"], e["kind"]) for e in events] == [
        ("somebody", "start"), ("somebody", "end")]
    start, end = events
    assert end["reason"] == "camera-silent" and end["ended"] == start["at"]
    assert end["at"] - end["ended"] >= 1.0
