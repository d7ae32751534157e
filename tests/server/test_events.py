"""Action events from scripted probability sequences (server/events.py): one prediction a
second, times given, so each rule is checked exactly."""

from __future__ import annotations

import random
import signal
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from stgcnd.errors import UserError
from stgcnd.server.cameras import EVICT_IDLE_S
from stgcnd.server.config import EventsConfig, load_config
from stgcnd.server.events import Events
from stgcnd_client import Client
from stgcnd_client import Events as Subscriber
from tests.server.daemon_harness import Daemon, stop_by_pid, write_config

LABELS = ("normal", "shoplifting")


def run(sequence, config=None, camera="cam1", start=0.0, events=None):
    """Feed P(shoplifting) one a second; every event, in order."""
    events = events or watching(config or EventsConfig(min_duration_s=2.0, cooldown_s=10.0))
    out = []
    for i, p in enumerate(sequence):
        t = start + i
        out += events.observe(camera, "m", [1.0 - p, p], now=t, wall=1000.0 + t)
    return out


def watching(config):
    events = Events()
    assert events.configure({"m": (config, LABELS)}, now=0.0, wall=1000.0) == []
    return events


def kinds(events):
    return [e["kind"] for e in events]


def test_a_one_window_spike_raises_no_event():
    assert run([0.1, 0.1, 0.99, 0.1, 0.1, 0.1]) == []


def test_a_steady_action_raises_exactly_one_start_and_one_end():
    out = run([0.1] * 3 + [0.95] * 10 + [0.05] * 5)
    assert kinds(out) == ["start", "end"]
    start, end = out
    assert start["class"] == "shoplifting" and start["camera"] == "cam1"
    assert start["id"] == end["id"]
    # The EMA (alpha 0.5, from 0.1) reaches 0.8 at the third high window (t=5: 0.84), held
    # 2 s: the start at t=7, dated from t=5.
    assert start["started"] == 1005.0 and start["at"] == 1007.0
    assert end["reason"] == "below-exit" and end["peak"] == 0.95
    assert end["ended"] == 1013.0 and end["duration_s"] == 8.0  # first low window: EMA 0.5


def test_no_event_within_the_cooldown_and_one_after_it():
    burst = [0.95] * 6 + [0.0] * 3
    out = run(burst * 3)                        # bursts 9 s apart, cooldown 10 s
    assert kinds(out) == ["start", "end", "start", "end"]
    assert out[2]["started"] - out[1]["ended"] >= 10
    assert out[2]["id"] != out[0]["id"] and out[2]["id"] == out[3]["id"]


def test_flicker_at_the_threshold_is_one_event_not_many():
    """Hovering around enter (0.8) never dips below exit (0.5): the hysteresis holds."""
    out = run([0.95] * 4 + [0.75, 0.85] * 20 + [0.0] * 4)
    assert kinds(out) == ["start", "end"]


def test_noise_below_enter_raises_nothing():
    rng = random.Random(3)
    assert run([rng.uniform(0.0, 0.79) for _ in range(300)]) == []


def test_k_of_n_needs_k_high_windows_among_the_last_n():
    config = EventsConfig(smoothing="k-of-n", k=3, n=5, min_duration_s=0.0, cooldown_s=0.0)
    assert run([0.9, 0.1, 0.9, 0.1, 0.1, 0.1], config) == []        # 2 of 5
    out = run([0.9, 0.1, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1], config)     # 3 of 5, then fewer
    assert kinds(out) == ["start", "end"]


def test_a_quiet_class_a_class_threshold_and_a_disabled_camera():
    config = load_config_text("""
        [models.events]
        min_duration_s = 0.0
        [models.events.classes.shoplifting]
        enter = 0.95
        [models.events.cameras.lobby]
        enabled = false
    """).models[0].events
    assert run([0.9] * 5, config) == []                     # below the class's 0.95
    assert kinds(run([0.97] * 5, config)) == ["start"]
    assert run([0.97] * 5, config, camera="lobby") == []    # events off for this camera
    # "normal" (the first label) is quiet by default: a high P(normal) raises nothing.
    assert run([0.0] * 5, config) == []


def test_reload_keeps_an_open_event_and_a_removed_model_ends_it():
    events = watching(EventsConfig(min_duration_s=0.0))
    assert kinds(run([0.9] * 3, events=events)) == ["start"]
    # New thresholds: the event stays open (no end, no second start) and ends by them.
    stricter = EventsConfig(min_duration_s=0.0, enter=0.9, exit=0.85, exit_hold_s=0.0)
    assert events.configure({"m": (stricter, LABELS)}, now=3.0, wall=1003.0) == []
    assert events.open_events() == 1
    assert kinds(run([0.9], events=events, start=4.0)) == []
    out = run([0.7], events=events, start=5.0)   # EMA 0.8: below the new exit, not the old
    assert kinds(out) == ["end"] and out[0]["reason"] == "below-exit"
    assert kinds(run([0.95] * 3, events=events, start=40.0)) == ["start"]  # after cooldown
    out = events.configure({}, now=50.0, wall=1050.0)
    assert kinds(out) == ["end"] and out[0]["reason"] == "model-removed"


def test_reload_watches_a_class_made_loud_and_ends_a_removed_model_by_its_labels():
    quiet_all = EventsConfig(min_duration_s=0.0, quiet_classes=LABELS)
    events = watching(quiet_all)
    assert run([0.9] * 3, events=events) == []               # nothing watched
    loud = EventsConfig(min_duration_s=0.0)
    assert events.configure({"m": (loud, LABELS)}, now=3.0, wall=1003.0) == []
    assert kinds(run([0.9] * 2, events=events, start=4.0)) == ["start"]
    (end,) = events.configure({}, now=10.0, wall=1010.0)
    assert (end["class"], end["reason"]) == ("shoplifting", "model-removed")


def test_k_of_n_ends_report_its_value_and_a_switch_to_it_keeps_the_event_open():
    events = watching(EventsConfig(min_duration_s=0.0))
    assert kinds(run([0.9] * 3, events=events)) == ["start"]
    k_of_n = EventsConfig(min_duration_s=0.0, smoothing="k-of-n", k=3, n=5)
    assert events.configure({"m": (k_of_n, LABELS)}, now=3.0, wall=1003.0) == []
    assert run([0.7], events=events, start=4.0) == []       # still 0.9 three of five times
    (end,) = events.close_all(now=5.0, wall=1005.0, reason="shutdown")
    assert end["probability"] == 0.9 and end["reason"] == "shutdown"


def test_shutdown_and_a_vanished_camera_close_open_events_with_a_reason():
    events = watching(EventsConfig(min_duration_s=0.0))
    run([0.9] * 3, events=events)
    run([0.9] * 3, events=events, camera="cam2")
    out = events.forget("cam2", now=5.0, wall=1005.0, reason="camera-idle")
    assert [(e["camera"], e["reason"]) for e in out] == [("cam2", "camera-idle")]
    out = events.close_all(now=6.0, wall=1006.0, reason="shutdown")
    assert [(e["camera"], e["kind"], e["reason"]) for e in out] == [("cam1", "end", "shutdown")]


def load_config_text(text):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.toml"
        path.write_text('[[models]]\ndemo = true\nlabels = ["normal", "shoplifting"]\n'
                        + textwrap.dedent(text))
        return load_config(path, env={})


@pytest.mark.parametrize("text, message", [
    ("[models.events]\nenter = 0.5\nexit = 0.6\n", "exit (0.6) must be <= enter"),
    ("[models.events]\nsmoothing = \"k-of-n\"\nk = 6\nn = 5\n", "k (6) must be <= n (5)"),
    ("[models.events.classes.theft]\nenter = 0.9\n", "names class 'theft'"),
    ("[models.events]\nenter = 1.5\n", "enter"),
])
def test_bad_event_settings_are_refused_with_the_fix(text, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config_text(text)


NOOP_EVENTS = """[[models]]
name = "demo"
backend = "noop"
demo = true
frames = 30
labels = ["normal", "shoplifting"]
[models.events]
enter = 0.5
exit = {exit}
min_duration_s = 0.0
"""
# The tests below send empty windows (no person: they start no event by default, #34) and
# pause for reloads and evictions (a camera silent event_idle_s ends its events).
EVENTS_MODEL = NOOP_EVENTS + "min_usable = 0.0\nevent_idle_s = 600.0\n"


def test_the_daemon_publishes_events_and_closes_them_at_shutdown(tmp_path):
    """The noop backend's zero logits give P(shoplifting) = 0.5 on every window: at enter
    0.5 the first prediction starts an event, a reload with another exit keeps it open, and
    the shutdown ends it, on the PUB endpoint (through the client's subscriber) and in the
    log alike."""
    endpoint = f"ipc://{tmp_path / 'events.sock'}"
    d = Daemon(tmp_path, models=EVENTS_MODEL.format(exit=0.4), events_endpoint=endpoint)
    d.start()
    try:
        with Subscriber(endpoint, cameras=["cam1"]) as events, Subscriber(endpoint) as every:
            window = np.zeros((3, 30, 33, 1), np.float32)
            # PUB/SUB: a subscription reaches the publisher a moment after connecting. A
            # throwaway camera's events show when it has (each starts one event, and both
            # subscribers connected at once).
            for i in range(50):
                with Client(d.endpoint, camera_id=f"warm-up-{i}") as warm:
                    warm.infer(window)
                if every.recv(timeout_ms=100) is not None:
                    break
            with Client(d.endpoint, camera_id="cam1") as client, \
                    Client(d.endpoint, camera_id="cam2") as other:
                for _ in range(3):
                    client.infer(window)
                other.infer(window)          # another camera: not subscribed to
            start = events.recv(timeout_ms=5000)
            assert start is not None and start["kind"] == "start"
            assert (start["camera"], start["class"]) == ("cam1", "shoplifting")
            write_config(d.config_path, d.endpoint, d.engines,
                         models=EVENTS_MODEL.format(exit=0.45), events_endpoint=endpoint)
            d.signal(signal.SIGHUP)
            d.notify.wait_for("READY", timeout=60)
            with Client(d.endpoint, camera_id="cam1") as client:
                client.infer(window)
            assert events.recv(timeout_ms=500) is None   # still open: no end, no second start
            d.signal(signal.SIGTERM)
            end = events.recv(timeout_ms=10000)
            assert end is not None and (end["kind"], end["reason"]) == ("end", "shutdown")
            assert end["id"] == start["id"]
        assert d.proc.wait(30) == 0
    finally:
        stop_by_pid(d)
    # The same empty windows (no person in any frame): the quality lines say so, and at most
    # one warning per camera, not one per interval (it takes feed_intervals intervals of
    # them: tests/server/test_feed_health.py).
    cam1 = [e for e in d.log_events() if e.get("event") == "skeleton_quality"
            and e.get("camera") == "cam1" and e.get("frames")]
    assert cam1 and all(e["no_person"] == 1.0 and e["usable"] == 0.0 for e in cam1)
    low = [e["camera"] for e in d.log_events() if e.get("event") == "skeleton_quality_low"]
    assert len(low) == len(set(low))
    logged = [e for e in d.log_events() if e.get("event") == "action_event"]
    mine = [(e["camera"], e["kind"]) for e in logged if not e["camera"].startswith("warm")]
    assert mine == [("cam1", "start"), ("cam2", "start"), ("cam1", "end"), ("cam2", "end")]


@pytest.mark.slow
def test_a_camera_evicted_for_another_ends_its_events_at_once(tmp_path):
    """#33: an eviction reached the events at the next stats tick (seconds later, dated
    then). The request path that evicts a camera now ends its open events itself: with one
    camera slot and stats a minute apart, cam2 taking cam1's slot ends cam1's event at once."""
    endpoint = f"ipc://{tmp_path / 'events.sock'}"
    d = Daemon(tmp_path, models=EVENTS_MODEL.format(exit=0.4), events_endpoint=endpoint,
               max_cameras=1, env={"STGCND_STATS_INTERVAL": "60"})
    d.start()
    try:
        with Subscriber(endpoint) as events:
            window = np.zeros((3, 30, 33, 1), np.float32)
            for _ in range(50):  # until the subscription has reached the publisher
                with Client(d.endpoint, camera_id="cam1") as cam1:
                    cam1.infer(window)
                start = events.recv(timeout_ms=100)
                if start is not None:
                    break
            assert start is not None and (start["kind"], start["camera"]) == ("start", "cam1")
            time.sleep(EVICT_IDLE_S + 0.2)  # cam1 quiet that long: a new camera takes its slot
            with Client(d.endpoint, camera_id="cam2") as cam2:
                cam2.infer(window)
            end = events.recv(timeout_ms=5000)
            assert end is not None and (end["kind"], end["camera"], end["reason"]) == (
                "end", "cam1", "camera-evicted")
        assert d.stop() == 0
    finally:
        stop_by_pid(d)
