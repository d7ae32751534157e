"""What a broker retains of the daemon never lies (issue #42, item 1), against a real Mosquitto:
PREFIX/status says online/offline (offline as the will, at a crash), a crashed run's open
events are ended at the next start and its retained states cleared, cameras gone for
`forget_after_s` lose their retained topics, and a broker restarted without persistence gets
every retained state again (server/mqtt_sink.py, server/mqtt_retained.py)."""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid

import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from stgcnd.server.config import MqttConfig
from stgcnd.server.mqtt_sink import MqttSink
from stgcnd_client import Client
from tests.mosquitto import Broker, Recorder, needs_mosquitto
from tests.server.daemon_harness import Daemon, stop_by_pid
from tests.server.test_mqtt_daemon import MODELS

# In-process sinks reconnect sooner (tests/server/conftest.py).
pytestmark = pytest.mark.usefixtures("quick_reconnects")


def retained(broker: Broker, topic: str) -> dict[str, bytes]:
    """Topic -> payload of what the broker retains now under `topic` (a fresh subscriber: a
    clean session gets exactly the retained messages, then what is published live). A
    subscription's retained messages are queued to it at once, before anything published
    after its SUBACK: a marker published then comes after the last of them."""
    got: dict[str, bytes] = {}
    done = threading.Event()
    marker = f"peek/{uuid.uuid4().hex}"
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"peek-{uuid.uuid4().hex[:8]}",
                         clean_session=True, protocol=mqtt.MQTTv311)

    def on_message(c: mqtt.Client, userdata: object, m: mqtt.MQTTMessage) -> None:
        if m.topic == marker:
            done.set()
        elif m.retain:
            got[m.topic] = m.payload

    client.on_connect = lambda c, *_: c.subscribe([(topic, 1), (marker, 1)])
    client.on_subscribe = lambda c, *_: c.publish(marker, b"", qos=1)
    client.on_message = on_message
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        assert done.wait(10), "no SUBACK or no marker"
    finally:
        client.disconnect()
        client.loop_stop()
    return dict(got)


def poll(predicate, timeout: float) -> float | None:
    """Seconds until `predicate()` held, or None if it never did within `timeout`."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if predicate():
            return time.monotonic() - began
        time.sleep(0.1)
    return None


def put_retained(broker: Broker, topics: dict[str, object]) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="seed", protocol=mqtt.MQTTv311)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    for topic, body in topics.items():
        payload = body if isinstance(body, str) else json.dumps(body)
        client.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)
    client.disconnect()
    client.loop_stop()


@needs_mosquitto
def test_a_crashed_runs_open_event_ends_and_a_camera_gone_is_removed_at_start(broker):
    """Retained as a run killed mid-event leaves them: door's state open, a camera last heard
    of 1000 s ago. A new sink (forget_after_s 100) ends door's event (daemon-restart, dated at
    the old run's last message), clears its state, removes the old camera's, and says online;
    its clean stop says offline."""
    now = time.time()
    start = {"kind": "start", "id": "door/demo/1/1000", "camera": "door", "class": "theft",
             "started": now - 30, "at": now - 29, "mqtt_id": "111-1"}
    feed = {"kind": "feed", "camera": "hall", "state": "ok", "at": now - 12, "mqtt_id": "111-2"}
    put_retained(broker, {
        "site/door/state": {"camera": "door", "open": [start], "last": start},
        "site/hall/state": {"camera": "hall", "open": [], "last": feed},
        "site/gone/state": {"camera": "gone", "open": [],
                            "last": {"kind": "feed", "at": now - 1000, "mqtt_id": "99-7"}},
        "site/status": "online"})   # the crashed run's, never taken back (no will then)
    recorder = Recorder(broker, "site/+/event", client_id="events")
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-r", topic_prefix="site",
                               forget_after_s=100))
    try:
        ends = recorder.wait_for(1, timeout=10)
        assert [(e["kind"], e["id"], e["reason"]) for e in ends] == [
            ("end", "door/demo/1/1000", "daemon-restart")]
        assert ends[0]["ended"] == round(now - 12, 3)   # run 111's last message: hall's feed
        assert ends[0]["duration_s"] == 18.0 and ends[0]["mqtt_id"].startswith(f"{sink._run}-")
        assert poll(lambda: sink.stats()["in_flight"] == 0 and sink.stats()["buffered"] == 0, 10)
        kept = retained(broker, "site/#")
        assert sorted(kept) == ["site/door/class/theft", "site/door/state", "site/hall/state",
                                "site/status"]
        assert kept["site/door/class/theft"] == b"OFF"   # made from the state made true
        door = json.loads(kept["site/door/state"])
        assert (door["open"], door["last"]["reason"]) == ([], "daemon-restart")
        assert json.loads(kept["site/hall/state"])["last"] == feed   # true: left as it was
        assert kept["site/status"] == b"online"
    finally:
        sink.close()
        recorder.close()
    assert retained(broker, "site/status") == {"site/status": b"offline"}


@needs_mosquitto
def test_a_broker_restarted_without_persistence_gets_every_state_again(broker):
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-p"))
    try:
        sink.send({"kind": "start", "id": "cam1/demo/1/5", "camera": "cam1", "at": time.time()})
        sink.send({"kind": "feed", "camera": "cam2", "state": "silent", "at": time.time()})
        assert poll(lambda: len(retained(broker, "stgcnd/#")) == 4, 10)  # + cam2/feed
        broker.stop()
        (broker.dir / "mosquitto.db").unlink()   # what a broker without persistence forgets
        assert retained(broker.start(), "stgcnd/#") == {}
        assert poll(lambda: sink.stats()["connects"] == 2, 20)
        took = poll(lambda: len(retained(broker, "stgcnd/#")) == 4, 10)
        assert took is not None, "the retained states did not come again within 10 s"
        kept = retained(broker, "stgcnd/#")
        assert [e["id"] for e in json.loads(kept["stgcnd/cam1/state"])["open"]] == [
            "cam1/demo/1/5"]
        assert json.loads(kept["stgcnd/cam2/state"])["last"]["state"] == "silent"
        assert kept["stgcnd/status"] == b"online"
        print(f"\nretained states again {took:.2f} s after the reconnect")
    finally:
        sink.close()


WINDOW = np.zeros((3, 30, 33, 1), np.float32)


@needs_mosquitto
@pytest.mark.slow
def test_sigkill_during_an_event_leaves_offline_and_the_restart_ends_it(tmp_path):
    """The daemon killed with an event open: the broker's will says offline within 5 s; the
    next run, within 10 s of READY, has published the event's end (daemon-restart) and no
    retained state shows it open; its clean stop says offline."""
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker").start()
    recorder = Recorder(broker, "stgcnd/+/event", client_id="events")
    d = Daemon(tmp_path, models=MODELS.format(broker=broker.url, buffer=1000),
               idle_timeout=600.0, feed_intervals=1000)
    try:
        d.start()
        with Client(d.endpoint, camera_id="cam0") as client:
            client.infer(WINDOW, timeout=10.0)
        started = recorder.wait_for(1, timeout=10)
        assert [e["kind"] for e in started] == ["start"]
        assert poll(lambda: json.loads(retained(broker, "stgcnd/cam0/state").get(
            "stgcnd/cam0/state", b'{"open": []}'))["open"], 10)
        assert retained(broker, "stgcnd/status") == {"stgcnd/status": b"online"}

        d.signal(signal.SIGKILL)
        assert d.proc is not None and d.proc.wait(10) == -signal.SIGKILL
        assert poll(lambda: retained(broker, "stgcnd/status") == {
            "stgcnd/status": b"offline"}, 5) is not None, "no offline within 5 s of the kill"

        d.start()
        ready = time.monotonic()

        def ended() -> bool:
            ends = [e for e in recorder.events() if e["kind"] == "end"]
            state = retained(broker, "stgcnd/+/state")
            return [(e["id"], e["reason"]) for e in ends] == [
                (started[0]["id"], "daemon-restart")] and all(
                json.loads(p)["open"] == [] for p in state.values()) and bool(state)

        assert poll(ended, 10) is not None, (recorder.events(), retained(broker, "stgcnd/#"))
        print(f"\nafter the kill: the end and the cleared state {time.monotonic() - ready:.2f}"
              " s after READY")
        assert retained(broker, "stgcnd/status") == {"stgcnd/status": b"online"}
        assert stop_by_pid(d) == 0
        assert retained(broker, "stgcnd/status") == {"stgcnd/status": b"offline"}
    finally:
        stop_by_pid(d)
        recorder.close()
        broker.stop()


@needs_mosquitto
def test_a_camera_quiet_past_forget_after_s_is_not_brought_back(broker):
    """This run's state of a camera quiet for forget_after_s with nothing open leaves the
    sink's memory (camera ids that come and go cost nothing for ever): a broker that lost
    its retained states gets the others again, not that one."""
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-f", forget_after_s=60))
    try:
        sink.send({"kind": "feed", "camera": "old", "state": "silent", "at": time.time() - 90})
        sink.send({"kind": "feed", "camera": "new", "state": "ok", "at": time.time()})
        assert poll(lambda: len(retained(broker, "stgcnd/#")) == 5, 10)  # + 2 feeds
        broker.stop()
        (broker.dir / "mosquitto.db").unlink()
        broker.start()
        assert poll(lambda: sink.stats()["connects"] == 2, 20)
        assert poll(lambda: len(retained(broker, "stgcnd/#")) == 3, 10)
        assert sorted(retained(broker, "stgcnd/#")) == [
            "stgcnd/new/feed", "stgcnd/new/state", "stgcnd/status"]
    finally:
        sink.close()
