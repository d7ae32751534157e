"""Feed health (server/feed_health.py) on scripted skeleton_quality records: each state is
said once, after feed_intervals intervals, held between feed_exit and feed_enter, left for ok
(a recovery) or for a state that comes first; and the counting under it
(telemetry/skeleton_quality.py): refusals, what a camera sent, coordinates out of frame."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import zmq
from structlog.testing import capture_logs

from stgcnd.server.config import ServerConfig, load_config
from stgcnd.server.event_hub import EventHub
from stgcnd.server.feed_health import FeedHealth
from stgcnd.telemetry.skeleton_quality import MAX_STRANGERS, SkeletonQuality

CONFIG = ServerConfig(feed_enter=0.5, feed_exit=0.2, feed_intervals=2)


def record(camera="cam1", sent=100, frames=100, refused_input=0, refused_busy=0,
           no_person=0.0, low_visibility=0.0, out_of_frame=0.0):
    return {"camera": camera, "sent": sent, "frames": frames, "refused_input": refused_input,
            "refused_busy": refused_busy, "no_person": no_person, "visibility": 0.9,
            "low_visibility": low_visibility, "out_of_frame": out_of_frame}


def run(script, config=CONFIG, health=None):
    """One record per interval (one a second from t=1000); [(t, state, previous)]."""
    health = health or FeedHealth()
    out = []
    for i, r in enumerate(script):
        out += [(i, c["state"], c["previous"]) for c in health.update([r], 1000.0 + i, config)]
    return out


GOOD = record()


@pytest.mark.parametrize(("bad", "state"), [
    (record(sent=0, frames=0, no_person=None, low_visibility=None, out_of_frame=None), "silent"),
    (record(frames=0, refused_input=100, no_person=None), "refused"),
    (record(frames=40, refused_busy=60), "blocked"),
    (record(no_person=1.0, low_visibility=None, out_of_frame=None), "no-person"),
    (record(low_visibility=0.7), "low-visibility"),
    (record(out_of_frame=0.97), "out-of-frame"),
])
def test_each_state_is_said_after_two_intervals_and_its_recovery_too(bad, state):
    assert run([GOOD, bad, bad, bad, GOOD, GOOD, GOOD]) == [(2, state, "ok"), (5, "ok", state)]


def test_one_bad_interval_is_no_change():
    assert run([GOOD, record(out_of_frame=0.9), GOOD, record(out_of_frame=0.9), GOOD]) == []


def test_a_state_holds_between_exit_and_enter():
    hover = [record(no_person=s) for s in (0.6, 0.6, 0.4, 0.3, 0.25, 0.1, 0.1)]
    assert run(hover) == [(1, "no-person", "ok"), (6, "ok", "no-person")]
    assert run([record(no_person=0.45)] * 5) == []            # never reached enter


def test_a_state_that_comes_first_takes_over_and_flicker_between_bad_states_is_bad():
    silent = record(sent=0, frames=0, no_person=None, low_visibility=None, out_of_frame=None)
    script = [record(out_of_frame=0.9)] * 2 + [silent] * 2
    assert run(script) == [(1, "out-of-frame", "ok"), (3, "silent", "out-of-frame")]
    flicker = [record(no_person=0.9), record(low_visibility=0.9)] * 2
    assert run(flicker) == [(1, "low-visibility", "ok")]


def test_a_change_carries_its_figures_and_stats_the_state():
    health = FeedHealth()
    for i in range(2):
        changes = health.update([record(out_of_frame=0.97), record("cam2")], 10.0 + i, CONFIG)
    (change,) = changes
    assert change["kind"] == "feed" and change["camera"] == "cam1" and change["at"] == 11.0
    assert (change["state"], change["previous"], change["share"]) == ("out-of-frame", "ok", 0.97)
    assert change["previous_since"] == 10.0 and change["sent"] == 100
    assert health.states() == {"cam1": {"state": "out-of-frame", "since": 11.0},
                               "cam2": {"state": "ok", "since": 10.0}}
    health.update([record("cam2")], 12.0, CONFIG)                # cam1 gone: forgotten
    assert list(health.states()) == ["cam2"]


def test_feed_intervals_one_says_it_at_once_and_exit_above_enter_is_enter():
    config = ServerConfig(feed_enter=0.5, feed_exit=0.9, feed_intervals=1)
    assert run([record(no_person=0.6), record(no_person=0.4)], config) == [
        (0, "no-person", "ok"), (1, "ok", "no-person")]


# -- the counts under it --------------------------------------------------------------------
def frame(x, y, vis=0.9):
    f = np.zeros((3, 33, 1), np.float32)
    f[0], f[1], f[2] = x, y, vis
    return f


def test_coordinates_in_minus_three_to_three_and_pixels_are_out_of_frame():
    q = SkeletonQuality()
    rng = np.random.default_rng(0)
    for _ in range(20):
        q.add("garbage", frame(rng.uniform(-3, 3, (33, 1)), rng.uniform(-3, 3, (33, 1))))
        q.add("pixels", frame(rng.uniform(100, 1280, (33, 1)), rng.uniform(50, 720, (33, 1))))
        q.add("good", frame(rng.uniform(0, 1, (33, 1)), rng.uniform(0, 1, (33, 1))))
    by = {r["camera"]: r for r in q.drain([])}
    assert by["garbage"]["out_of_frame"] > 0.9 and by["pixels"]["out_of_frame"] == 1.0
    assert by["good"]["out_of_frame"] == 0.0


def test_refusals_are_counted_in_what_a_camera_sent():
    q = SkeletonQuality()
    q.add("cam1", frame(0.5, 0.5))
    q.refused("cam1", busy=True, known=True, counted=True)  # a push's frame: counted above
    q.refused("cam1", busy=True, known=True)  # an infer's window: not counted
    q.refused("cam1", busy=False, known=True)  # NaN: refused before it counted
    q.refused("nan-cam", busy=False, known=False)  # refused from the first
    by = {r["camera"]: r for r in q.drain(["cam1"])}
    assert (by["cam1"]["sent"], by["cam1"]["refused_busy"], by["cam1"]["refused_input"]) == \
        (3, 2, 1)
    assert by["nan-cam"]["sent"] == 1 and not by["nan-cam"]["silent"]


def test_strangers_are_counted_up_to_a_bound_each_interval():
    q = SkeletonQuality()
    for i in range(MAX_STRANGERS + 10):
        q.refused(f"invented-{i}", busy=False, known=False)
    q.refused("slotted", busy=False, known=True)
    assert len(q.drain([])) == MAX_STRANGERS + 1
    q.refused("invented-x", busy=False, known=False)   # a new interval
    assert [r["camera"] for r in q.drain([])] == ["invented-x"]


# -- the skeleton quality lines: the same state machine ---------------------------------------
def person(vis=0.9):
    return frame(np.full((33, 1), 0.5), np.full((33, 1), 0.5), vis)


def test_the_quality_lines_go_by_the_feeds_rule_on_real_frames():
    """An empty camera for three intervals: one low line after feed_intervals (2), with the
    floor; one recovered line after two good ones."""
    q, health = SkeletonQuality(), FeedHealth()
    empty = np.zeros((3, 33, 1), np.float32)
    notes = []
    for i, f in enumerate([person(), empty, empty, empty, person(), person()]):
        for _ in range(30):
            q.add("cam1", f)
        health.update(q.drain(["cam1"]), 1000.0 + i, CONFIG)
        notes += [(i, n["event"], n["usable"], n.get("floor")) for n in health.notes]
    assert notes == [(2, "skeleton_quality_low", 0.0, 0.5),
                     (5, "skeleton_quality_recovered", 1.0, None)]


def test_the_quality_lines_hold_between_the_floor_and_their_exit():
    """Low once usable is under quality_floor (0.5) two intervals in a row; held until it
    is at least 1 - 0.5 x feed_exit / feed_enter = 0.8 two intervals in a row, as the feed's
    states are held between feed_exit and feed_enter."""
    health = FeedHealth()
    said = []
    for i, usable in enumerate([0.4, 0.4, 0.6, 0.75, 0.79, 0.85, 0.7, 0.9, 0.95]):
        health.update([{**GOOD, "usable": usable}], 1000.0 + i, CONFIG)
        said += [(i, n["event"]) for n in health.notes]
    assert said == [(1, "skeleton_quality_low"), (8, "skeleton_quality_recovered")]


def test_a_camera_hovering_at_the_floor_for_a_minute_logs_one_low_and_one_recovery_at_most():
    """Issue #42: `skeleton_quality_low`/`_recovered` flapped (7 + 7 in 60 s) for a camera
    whose usable share hovered at quality_floor, while its feed said nothing. A minute of
    frames (25 a second, 4 s stats intervals) whose share of frames without a person goes
    0.45, 0.55, ... around the floor with runs of two, through the hub that logs the lines
    (server/event_hub.py: the quality counts, the feed's health, the log)."""
    config = load_config(None, env={})
    server = msgspec.structs.replace(config.server, stats_interval=4.0)
    config = msgspec.structs.replace(config, server=server)
    with zmq.Context() as ctx:
        hub = EventHub(ctx, config)
        hub.quality.sample_every = 1  # every frame: the shares asserted below are exact
        empty = np.zeros((3, 33, 1), np.float32)
        with capture_logs() as logs:
            for i in range(15):
                missing = 55 if i % 3 else 45   # of the interval's 100 frames
                for n in range(100):
                    hub.frame("cam1", empty if n < missing else person())
                hub.tick(4.0 * i, 4.0, ["cam1"], server)
        hub.close()
    usable = [line["usable"] for line in logs if line["event"] == "skeleton_quality"]
    assert usable == [0.55, 0.45, 0.45] * 5                 # it did hover at the floor
    lows = [line for line in logs if line["event"] == "skeleton_quality_low"]
    recovered = [line for line in logs if line["event"] == "skeleton_quality_recovered"]
    assert len(lows) <= 1 and len(recovered) <= 1, (len(lows), len(recovered))
