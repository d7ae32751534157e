"""Issue #42: event messages with context (the person who led the window that crossed, the
score that crossed, the model's label, site and zone tags), periodic `update` messages while
an event is open, and a crashed run's open events ended for ZeroMQ subscribers at the next
start (server/events.py, server/open_events.py, server/event_publisher.py)."""

from __future__ import annotations

import json
import signal
import time

import msgpack
import numpy as np
import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from stgcnd.errors import UserError
from stgcnd.server.config import CameraEvents, EventsConfig, load_config
from stgcnd.server.event_publisher import _ENCODER
from stgcnd.server.events import Events, usable_and_person
from stgcnd.server.mqtt_sink import _json
from stgcnd.server.open_events import OpenEventsFile, default_path
from stgcnd_client import Client
from stgcnd_client import Events as Subscriber
from tests.mosquitto import Broker, Recorder, needs_mosquitto
from tests.server.daemon_harness import Daemon, stop_by_pid, write_config
from tests.server.test_events import EVENTS_MODEL, LABELS

PAYLOAD_KEYS = {"person", "score", "model", "label", "class", "tags"}


def people(visibility: list[float], frames: int = 10, seen_frames: list[int] | None = None
           ) -> np.ndarray:
    """A window (3, T, V, M) whose person m has joints of visibility[m] in its first
    seen_frames[m] frames (default: all), in frame."""
    m = len(visibility)
    window = np.full((3, frames, 5, m), 0.5, np.float32)
    window[2] = 0.0
    for i, v in enumerate(visibility):
        window[2, :(seen_frames or [frames] * m)[i], :, i] = v
    return window


def test_the_leading_person_is_the_one_seen_in_the_most_frames_then_the_most_visible():
    assert usable_and_person(people([0.9]), 0.5) == (1.0, 0)             # M = 1: always 0
    assert usable_and_person(people([0.0, 0.0, 0.9]), 0.5)[1] == 2
    assert usable_and_person(people([0.9, 0.9], seen_frames=[4, 8]), 0.5)[1] == 1
    assert usable_and_person(people([0.7, 0.95, 0.6]), 0.5)[1] == 1      # a tie: visibility
    assert usable_and_person(people([0.8, 0.8]), 0.5)[1] == 0            # then the lower slot
    assert usable_and_person(people([0.0, 0.0]), 0.5) == (0.0, 0)        # nobody


def test_every_event_message_names_the_person_the_score_that_crossed_the_label_and_tags():
    config = EventsConfig(min_duration_s=2.0, cooldown_s=0.0, exit_hold_s=0.0,
                          tags={"site": "store-12", "zone": "aisle"},
                          cameras={"cam1": CameraEvents(tags={"zone": "entrance"})})
    events = Events()
    events.configure({"m": (config, LABELS)}, now=0.0, wall=1000.0)
    out = []
    for t, p in enumerate([0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.0]):
        # Person 1 leads until the crossing window (t = 3), person 2 after it.
        window = people([0.1, 0.9, 0.95 if t > 3 else 0.0])
        out += events.observe_window("cam1", "m", [1 - p, p], t, 1000.0 + t, window)
    start, end = out
    # The EMA from 0.1 reaches 0.8 at the third 0.9 (0.5, 0.7, 0.8): the crossing window.
    for message in (start, end):
        assert message["person"] == 1 and message["score"] == 0.8
        assert message["model"] == "m" and message["label"] == message["class"] == "shoplifting"
        assert message["tags"] == {"site": "store-12", "zone": "entrance"}  # the camera's zone
    assert start["started"] == 1003.0
    other = Events()
    other.configure({"m": (config, LABELS)}, now=0.0, wall=1000.0)
    got = [e for t in range(5) for e in other.observe_window(
        "cam2", "m", [0.0, 1.0], t, 1000.0 + t, people([0.9]))]
    assert got[0]["tags"] == {"site": "store-12", "zone": "aisle"} and got[0]["person"] == 0
    assert other.snapshot(1010.0)[0]["person"] == 0


def test_an_open_event_gets_an_update_every_update_interval_s_with_score_peak_and_duration():
    config = EventsConfig(min_duration_s=1.0, cooldown_s=0.0, exit_hold_s=0.0,
                          update_interval_s=3.0)
    events = Events()
    events.configure({"m": (config, LABELS)}, now=0.0, wall=1000.0)
    probs = [0.9, 0.9, 0.95, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.0, 0.0]
    out = [e for t, p in enumerate(probs)
           for e in events.observe("cam1", "m", [1 - p, p], now=t, wall=1000.0 + t)]
    assert [(e["kind"], e["at"]) for e in out] == [
        ("start", 1001.0), ("update", 1004.0), ("update", 1007.0), ("end", 1009.0)]
    update = out[1]
    assert update["id"] == out[0]["id"] and update["duration_s"] == 4.0
    assert update["peak"] == 0.95 and 0.9 <= update["probability"] <= 0.95
    assert update.keys() >= PAYLOAD_KEYS
    # Off by default: the same sequence has no update.
    quiet = Events()
    quiet.configure({"m": (EventsConfig(min_duration_s=1.0, exit_hold_s=0.0), LABELS)},
                    now=0.0, wall=1000.0)
    assert [e["kind"] for t, p in enumerate(probs)
            for e in quiet.observe("cam1", "m", [1 - p, p], now=t, wall=1000.0 + t)] == [
        "start", "end"]


def test_update_interval_s_has_a_lower_bound_the_broker_can_take(tmp_path):
    for value, ok in ((0.0, True), (0.5, False), (1.0, True)):
        path = write_config(tmp_path / "c.toml", "ipc:///tmp/x.sock", tmp_path / "e",
                            models=EVENTS_MODEL.format(exit=0.4)
                            + f"update_interval_s = {value}\n")
        if ok:
            load_config(path)
        else:
            with pytest.raises(UserError, match=r"update_interval_s 0\.5 is shorter than 1 s"):
                load_config(path)


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)  # TOML's strings


@settings(max_examples=150, deadline=None)
@given(tags=st.dictionaries(_TEXT, _TEXT, max_size=6), persons=st.integers(1, 8),
       lead=st.integers(0, 7), p=st.floats(0.0, 1.0), label=_TEXT.filter(bool))
def test_payload_fields_at_their_extremes_survive_every_path(tags, persons, lead, p, label):
    """PUB (msgpack), MQTT (its JSON) and the log (structlog's JSON) all carry the payload
    as built: any tag text, any person slot, a score from 0 to 1."""
    lead = min(lead, persons - 1)
    visibility = [0.0] * persons
    visibility[lead] = 1.0
    events = Events()
    config = EventsConfig(enter=0.0, exit=0.0, min_duration_s=0.0, tags=tags)
    events.configure({"m": (config, ("quiet", label))}, now=0.0, wall=1000.0)
    (start,) = events.observe_window("cam", "m", [1 - p, p], 1.0, 1001.0, people(visibility))
    assert start["person"] == lead and 0.0 <= float(start["score"]) <= 1.0
    assert start["tags"] == tags and start["label"] == label
    assert msgpack.unpackb(_ENCODER.encode(start), raw=False) == start
    assert json.loads(_json(start)) == start
    line = structlog.processors.JSONRenderer()(None, "info", {"event": "action_event",
                                                              **start})
    assert {k: v for k, v in json.loads(line).items() if k != "event"} == start


def test_a_corrupt_or_missing_open_events_file_is_said_once_and_taken_as_none(tmp_path):
    saved = OpenEventsFile(tmp_path / "open.json")
    assert saved.ended(2000.0) == []                              # missing: nothing, silently
    start = {"kind": "start", "id": "c/m/1/1000000", "camera": "c", "started": 1000.0,
             "seq": 4, "run": "old"}
    saved.save({"c/m/1/1000000": start}, 1500.0)
    assert not list(tmp_path.glob(".*.part"))                     # written whole, renamed
    (end,) = saved.ended(2000.0)
    assert end["kind"] == "end" and end["reason"] == "daemon-restart"
    assert (end["ended"], end["duration_s"], end["at"]) == (1500.0, 500.0, 2000.0)
    assert "seq" not in end and "run" not in end
    assert not saved.path.exists() and saved.ended(2001.0) == []  # said once
    with structlog.testing.capture_logs() as logs:
        saved.path.write_text('{"format": 1, "alive": 15')       # a torn file
        assert saved.ended(2002.0) == []
    assert [e["event"] for e in logs] == ["open_events_unreadable"]
    assert not saved.path.exists()


def test_each_events_endpoint_has_its_own_file(monkeypatch, tmp_path):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_path("ipc:///a") != default_path("ipc:///b")
    assert default_path("ipc:///a").parent == tmp_path / "stgcnd"
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "unit"))
    assert default_path("ipc:///a") == tmp_path / "unit" / "open-events.json"


WINDOW = np.zeros((3, 30, 33, 1), np.float32)
MODEL = EVENTS_MODEL.format(exit=0.4) + """update_interval_s = 1.0
tags = {site = "store-12"}
[models.events.cameras.cam1]
tags = {zone = "entrance"}
"""


def wait_subscribed(d: Daemon, sub: Subscriber) -> None:
    """Until `sub` hears a throwaway camera's start: its subscription reached the daemon."""
    for i in range(50):
        with Client(d.endpoint, camera_id=f"warm-up-{i}") as warm:
            warm.infer(WINDOW)
        if sub.recv(timeout_ms=100) is not None:
            return
    raise AssertionError("the subscription never reached the daemon")


@needs_mosquitto
@pytest.mark.slow
def test_pub_mqtt_and_the_log_carry_the_context_and_the_updates(tmp_path):
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker").start()
    recorder = Recorder(broker, "stgcnd/cam1/event", client_id="events")
    events = f"ipc://{tmp_path / 'events.sock'}"
    models = MODEL + f'\n[events.mqtt]\nbroker = "{broker.url}"\nclient_id = "stgcnd-t"\n'
    d = Daemon(tmp_path, models=models, events_endpoint=events, feed_intervals=1000,
               env={"XDG_STATE_HOME": str(tmp_path / "state")})
    try:
        d.start()
        with Subscriber(events, cameras=["cam1"]) as sub, Subscriber(events) as every:
            wait_subscribed(d, every)
            with Client(d.endpoint, camera_id="cam1") as cam:
                for _ in range(6):   # updates come at predictions, one a second at most
                    cam.infer(WINDOW)
                    time.sleep(0.5)
            got = []
            while len(got) < 3:
                event = sub.recv(timeout_ms=5000)
                assert event is not None, got
                got.append(event)
        assert [e["kind"] for e in got] == ["start", "update", "update"]
        mqtt = recorder.wait_for(3, timeout=10)
        logged = [e for e in d.log_events() if e.get("event") == "action_event"
                  and e.get("camera") == "cam1"]
        for path in (got, mqtt, logged):
            start, update = path[0], path[1]
            assert (start["person"], start["score"], start["label"], start["model"]) == (
                0, 0.5, "shoplifting", "demo")
            assert start["tags"] == {"site": "store-12", "zone": "entrance"}
            assert update["kind"] == "update" and update["id"] == start["id"]
            assert update["duration_s"] >= 1.0 and update["peak"] == 0.5
        assert stop_by_pid(d) == 0
    finally:
        stop_by_pid(d)
        recorder.close()
        broker.stop()


@pytest.mark.slow
def test_after_sigkill_the_first_snapshot_ends_what_the_killed_run_left_open(tmp_path):
    """The daemon killed during an event: at its next start a subscriber's first snapshot
    brings the event's `end` (reason daemon-restart, dated at the killed run's last sign of
    life), in the log too; a clean stop leaves nothing to end at the start after it."""
    events = f"ipc://{tmp_path / 'events.sock'}"
    state = tmp_path / "state"
    d = Daemon(tmp_path, models=EVENTS_MODEL.format(exit=0.4), events_endpoint=events,
               feed_intervals=1000, env={"XDG_STATE_HOME": str(state)})
    try:
        d.start()
        with Subscriber(events) as sub:
            wait_subscribed(d, sub)
            with Client(d.endpoint, camera_id="cam1") as cam:
                cam.infer(WINDOW)
            start = sub.recv(timeout_ms=5000)
            assert start is not None and start["camera"] == "cam1", start
        opened = {e["id"] for e in d.log_events()
                  if e.get("event") == "action_event" and e["kind"] == "start"}
        d.signal(signal.SIGKILL)
        assert d.proc is not None and d.proc.wait(10) == -signal.SIGKILL
        killed_at = time.time()

        d.start()
        with Subscriber(events, heartbeats=True) as sub:
            first: list[dict] = []
            beats = 0
            while True:  # until the heartbeat that closes the first snapshot
                event = sub.recv(timeout_ms=10000)
                assert event is not None, first
                first.append(event)
                beats += event["kind"] == "heartbeat"
                # A periodic heartbeat may come first: libzmq applies the subscription at
                # the beat's send, the loop reads it (and answers it) a pass later. The
                # snapshot comes within 0.2 s, the next periodic beat 2 s on.
                if event["kind"] == "heartbeat" and (len(first) > beats or beats == 2):
                    break
        ends = [e for e in first if e["kind"] == "end"]
        assert {e["id"] for e in ends} == opened and start["id"] in opened
        for end in ends:
            assert end["reason"] == "daemon-restart"
            assert end["started"] <= end["ended"] <= killed_at
            assert end["run"] != start["run"] and end["person"] == 0
        restarted = [e for e in d.log_events() if e.get("event") == "action_event"
                     and e.get("reason") == "daemon-restart"]
        assert {e["id"] for e in restarted} == opened            # logged once, at the start
        assert stop_by_pid(d) == 0
        assert not list((state / "stgcnd").glob("open-events-*.json"))  # nothing open
    finally:
        stop_by_pid(d)
