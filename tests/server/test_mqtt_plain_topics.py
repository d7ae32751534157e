"""Topics Home Assistant and Node-RED read without templates (issue #42), against a real
Mosquitto: PREFIX/CAMERA/class/CLASS ON/OFF and PREFIX/CAMERA/feed through an event and a
feed change, OFF after a crash, every one again after a broker lost them, removed with a
camera gone, and Home Assistant's discovery configs checked field by field against what its
MQTT discovery, binary sensor and sensor documentation require (server/mqtt_topics.py)."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from stgcnd.server.config import MqttConfig
from stgcnd.server.mqtt_sink import MqttSink
from stgcnd.server.mqtt_topics import FEED_STATES, ha_id
from stgcnd_client import Client
from tests.mosquitto import Broker, Recorder, needs_mosquitto
from tests.server.daemon_harness import Daemon, stop_by_pid
from tests.server.test_mqtt_daemon import MODELS, WINDOW
from tests.server.test_mqtt_restart import poll, put_retained, retained

# In-process sinks reconnect sooner (tests/server/conftest.py).
pytestmark = pytest.mark.usefixtures("quick_reconnects")

HA_ID = re.compile(r"[a-zA-Z0-9_-]+")


def start(camera: str, cls: str, at: float) -> dict[str, object]:
    return {"kind": "start", "id": f"{camera}/demo/{cls}/{round(at * 1e3)}", "camera": camera,
            "model": "demo", "class": cls, "class_index": 1, "started": at, "at": at}


def settled(sink: MqttSink) -> bool:
    s = sink.stats()
    return s["in_flight"] == 0 and s["buffered"] == 0


@needs_mosquitto
def test_class_and_feed_topics_follow_an_event_and_the_feed(broker):
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-plain"))
    try:
        now = time.time()
        opened = start("door/1", "fall", now)
        sink.send(opened)
        sink.send({"kind": "feed", "camera": "door/1", "state": "low-visibility", "at": now})
        assert poll(lambda: retained(broker, "stgcnd/door%2F1/class/fall") == {
            "stgcnd/door%2F1/class/fall": b"ON"}, 10) is not None
        assert retained(broker, "stgcnd/door%2F1/feed") == {
            "stgcnd/door%2F1/feed": b"low-visibility"}
        sink.send({**opened, "kind": "end", "reason": "below-exit", "at": now + 1})
        sink.send({"kind": "feed", "camera": "door/1", "state": "ok", "at": now + 1})
        assert poll(lambda: settled(sink), 10)
        assert retained(broker, "stgcnd/door%2F1/feed") == {"stgcnd/door%2F1/feed": b"ok"}
        assert retained(broker, "stgcnd/door%2F1/class/+") == {
            "stgcnd/door%2F1/class/fall": b"OFF"}
        # no discovery unless asked for
        assert retained(broker, "homeassistant/#") == {}
    finally:
        sink.close()


@needs_mosquitto
def test_a_broker_without_persistence_gets_every_plain_and_discovery_topic_again(broker):
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-again", discovery=True))
    try:
        now = time.time()
        sink.send(start("cam1", "fall", now))
        sink.send(start("cam1", "fight", now))
        sink.send({**start("cam1", "fight", now), "kind": "end", "at": now + 1})
        sink.send({"kind": "feed", "camera": "cam2", "state": "blocked", "at": now})
        assert poll(lambda: settled(sink), 10)
        before = {**retained(broker, "stgcnd/#"), **retained(broker, "homeassistant/#")}
        assert before["stgcnd/cam1/class/fall"] == b"ON"
        assert before["stgcnd/cam1/class/fight"] == b"OFF"
        assert before["stgcnd/cam2/feed"] == b"blocked"
        assert len([t for t in before if t.startswith("homeassistant/")]) == 4  # 2 + 2 feeds
        broker.stop()
        (broker.dir / "mosquitto.db").unlink()   # what a broker without persistence forgets
        broker.start()
        assert poll(lambda: sink.stats()["connects"] == 2, 20)
        reconnected = time.monotonic()

        def again() -> bool:
            now_kept = {**retained(broker, "stgcnd/#"),
                        **retained(broker, "homeassistant/#")}
            return {t: p for t, p in now_kept.items() if not t.endswith("/state")} == {
                t: p for t, p in before.items() if not t.endswith("/state")}

        assert poll(again, 10) is not None, "the plain topics did not come again within 10 s"
        print(f"\nplain and discovery topics again {time.monotonic() - reconnected:.2f} s "
              "after the reconnect was seen")
    finally:
        sink.close()


@needs_mosquitto
def test_a_crashed_runs_on_goes_off_and_a_camera_gone_loses_its_plain_topics(broker):
    """As a run killed mid-event leaves them: door's fall ON (its state open), and a camera
    gone for 1000 s with its topics and discovery configs. A new sink (forget_after_s 100,
    discovery off) turns fall OFF and removes every topic of the camera gone."""
    now = time.time()
    opened = {**start("door", "fall", now - 30), "mqtt_id": "111-1"}
    gone_cfg = "homeassistant/binary_sensor/sink-gone/gone__class__fight/config"
    put_retained(broker, {
        "site/door/state": {"camera": "door", "open": [opened], "last": opened,
                            "classes": ["fall"], "feed": "ok"},
        "site/door/class/fall": "ON", "site/door/feed": "ok",
        "site/gone/state": {"camera": "gone", "open": [], "classes": ["fight"], "feed": "ok",
                            "last": {"kind": "feed", "at": now - 1000, "mqtt_id": "99-7"}},
        "site/gone/class/fight": "OFF", "site/gone/feed": "ok", gone_cfg: "{}",
        "homeassistant/sensor/sink-gone/gone__feed/config": "{}"})
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-gone", topic_prefix="site",
                               forget_after_s=100))
    try:
        assert poll(lambda: retained(broker, "site/door/class/fall") == {
            "site/door/class/fall": b"OFF"}, 10) is not None
        assert poll(lambda: settled(sink), 10)
        assert sorted(retained(broker, "site/#")) == [
            "site/door/class/fall", "site/door/feed", "site/door/state", "site/status"]
        assert retained(broker, "homeassistant/#") == {}
    finally:
        sink.close()


@needs_mosquitto
def test_discovery_configs_carry_every_field_home_assistant_needs(broker):
    """Field by field, what Home Assistant's MQTT discovery docs require or need for a binary
    sensor and a sensor: the topic's form and id characters, state_topic (required) equal to
    the topic the daemon publishes the state on, unique_id unique and valid, device with
    identifiers, availability on the status topic with the payloads the daemon publishes
    there, payload_on/off equal to what the class topic carries, default_entity_id of the
    component's domain. Camera ids that differ only in characters HA refuses stay apart."""
    cameras = ["door 1", "door_1", "door-1", "Dör/1"]
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="edge box", discovery=True,
                               discovery_prefix="ha"))
    try:
        now = time.time()
        for camera in cameras:
            sink.send(start(camera, "fall", now))
            sink.send({"kind": "feed", "camera": camera, "state": "ok", "at": now})
        assert poll(lambda: settled(sink), 10)
        configs = {t: json.loads(p) for t, p in retained(broker, "ha/#").items()}
        states = retained(broker, "stgcnd/#")
    finally:
        sink.close()
    assert len(configs) == 2 * len(cameras)
    unique_ids, devices = [], set()
    for topic, config in configs.items():
        prefix, component, node, object_id, last = topic.split("/")
        assert (prefix, last) == ("ha", "config") and component in ("binary_sensor", "sensor")
        assert HA_ID.fullmatch(node) and HA_ID.fullmatch(object_id), topic
        assert node == ha_id("edge box") == "edge_20box"
        assert HA_ID.fullmatch(config["unique_id"]), config["unique_id"]
        unique_ids.append(config["unique_id"])
        assert config["default_entity_id"].startswith(f"{component}.")
        assert isinstance(config["name"], str) and config["name"]
        device = config["device"]
        assert isinstance(device["identifiers"], list) and device["identifiers"]
        assert device["name"] in cameras
        assert {"model", "manufacturer", "sw_version"} <= set(device)
        devices.add(device["identifiers"][0])
        # availability: the status topic, with what the daemon says on it
        assert config["availability_topic"] == "stgcnd/status"
        assert (config["payload_available"], config["payload_not_available"]) == (
            "online", "offline")
        # state_topic: a topic the daemon publishes to, with payloads HA understands
        assert config["state_topic"] in states, config["state_topic"]
        state = states[config["state_topic"]]
        if component == "binary_sensor":
            assert (config["payload_on"], config["payload_off"]) == ("ON", "OFF")
            assert state == config["payload_on"].encode()   # the event is open
            assert config["state_topic"].endswith("/class/fall") and config["name"] == "fall"
        else:
            assert config["device_class"] == "enum"
            assert config["options"] == list(FEED_STATES) and state.decode() in FEED_STATES
            assert config["state_topic"].endswith("/feed")
    assert len(set(unique_ids)) == len(unique_ids) == 8   # unique, the cameras kept apart
    assert len(devices) == len(cameras)   # one device a camera, its two entities on it
    # the status topic's payloads are the availability ones (online now; offline at the stop)
    assert retained(broker, "stgcnd/status") == {"stgcnd/status": b"offline"}


@needs_mosquitto
@pytest.mark.slow
def test_sigkill_during_an_event_the_class_topic_is_off_after_the_restart(tmp_path):
    """The daemon killed with shoplifting ON on cam0: within 10 s of the next run's READY the
    class topic says OFF (and its discovery config is still there)."""
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker").start()
    recorder = Recorder(broker, "stgcnd/+/event", client_id="events")
    d = Daemon(tmp_path, models=MODELS.format(broker=broker.url, buffer=1000) +
               "discovery = true\n", idle_timeout=600.0, feed_intervals=1000)
    topic = "stgcnd/cam0/class/shoplifting"
    try:
        d.start()
        with Client(d.endpoint, camera_id="cam0") as client:
            client.infer(WINDOW, timeout=10.0)
        assert poll(lambda: retained(broker, topic) == {topic: b"ON"}, 10) is not None
        d.signal(signal.SIGKILL)
        assert d.proc is not None and d.proc.wait(10) == -signal.SIGKILL
        assert retained(broker, topic) == {topic: b"ON"}   # what the crash left
        d.start()
        ready = time.monotonic()
        took = poll(lambda: retained(broker, topic) == {topic: b"OFF"}, 10)
        assert took is not None, retained(broker, "stgcnd/#")
        print(f"\nafter the kill: {topic} OFF {time.monotonic() - ready:.2f} s after READY")
        assert len(retained(broker, "homeassistant/#")) == 2   # the binary sensor, the feed
        assert stop_by_pid(d) == 0
    finally:
        stop_by_pid(d)
        recorder.close()
        broker.stop()
