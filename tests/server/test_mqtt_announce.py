"""Every entity at once, and nothing left behind (issue #42, topics without templates), against
a real Mosquitto: a camera's first request makes its class topics (OFF) for every class its
models watch and its feed topic (the feed's starting state), with their discovery configs;
discovery turned off withdraws the configs an earlier run published; a camera forgotten and
back, then gone, loses every class topic it ever had; a camera only announced is forgotten
too (server/mqtt_sink.py, server/mqtt_retained.py, server/event_hub.py)."""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from stgcnd.server.config import MqttConfig
from stgcnd.server.feed_health import OK
from stgcnd.server.mqtt_sink import MqttSink
from stgcnd_client import Client
from tests.mosquitto import Broker, needs_mosquitto
from tests.server.daemon_harness import Daemon, stop_by_pid
from tests.server.test_mqtt_daemon import MODELS, WINDOW
from tests.server.test_mqtt_plain_topics import settled, start
from tests.server.test_mqtt_restart import poll, put_retained, retained

# In-process sinks reconnect sooner (tests/server/conftest.py).
pytestmark = pytest.mark.usefixtures("quick_reconnects")


@needs_mosquitto
def test_an_announced_camera_has_every_class_off_and_its_feed_at_once(broker):
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="node", discovery=True))
    try:
        sink.announce("door/1", ["fight", "fall"], OK)
        assert poll(lambda: settled(sink), 10) is not None
        assert retained(broker, "stgcnd/door%2F1/+/+") == {
            "stgcnd/door%2F1/class/fall": b"OFF", "stgcnd/door%2F1/class/fight": b"OFF"}
        assert retained(broker, "stgcnd/door%2F1/feed") == {"stgcnd/door%2F1/feed": b"ok"}
        configs = {t: json.loads(p) for t, p in retained(broker, "homeassistant/#").items()}
        assert sorted(c["state_topic"] for c in configs.values()) == [
            "stgcnd/door%2F1/class/fall", "stgcnd/door%2F1/class/fight", "stgcnd/door%2F1/feed"]
        # an event then turns its class ON, the other stays OFF; announced again: the same
        now = time.time()
        sink.send(start("door/1", "fall", now))
        sink.announce("door/1", ["fall"], OK)
        assert poll(lambda: retained(broker, "stgcnd/door%2F1/class/+") == {
            "stgcnd/door%2F1/class/fall": b"ON", "stgcnd/door%2F1/class/fight": b"OFF"}, 10)
        state = json.loads(retained(broker, "stgcnd/door%2F1/state")["stgcnd/door%2F1/state"])
        assert state["classes"] == ["fall", "fight"] and state["feed"] == OK
        assert len(state["open"]) == 1
    finally:
        sink.close()


@needs_mosquitto
def test_discovery_turned_off_withdraws_this_nodes_configs_at_start(broker):
    """An earlier run with discovery on left configs for `cam` under node `edge`; another node's
    config is not this daemon's. A sink with discovery off empties edge's, keeps the other."""
    body = {"state_topic": "stgcnd/cam/class/fall"}
    mine = ["homeassistant/binary_sensor/edge/cam__class__fall/config",
            "homeassistant/sensor/edge/cam__feed/config",
            "homeassistant/sensor/edge/old__feed/config"]
    other = "homeassistant/sensor/other/cam__feed/config"
    put_retained(broker, {**{t: body for t in mine}, other: body,
                          "stgcnd/cam/class/fall": "OFF"})
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="edge"))
    try:
        sink.send({"kind": "feed", "camera": "cam", "state": OK, "at": time.time()})
        assert poll(lambda: list(retained(broker, "homeassistant/#")) == [other], 10) \
            is not None, retained(broker, "homeassistant/#")
        assert poll(lambda: settled(sink), 10) is not None
        assert list(retained(broker, "homeassistant/#")) == [other]   # none published anew
        assert retained(broker, "stgcnd/cam/class/fall") == {"stgcnd/cam/class/fall": b"OFF"}
    finally:
        sink.close()


@needs_mosquitto
def test_a_camera_forgotten_and_back_then_gone_loses_every_topic(broker):
    """Run 1 forgets `cam` from memory after its fight event (quiet past forget_after_s), and
    `cam` comes back with a feed change: its state lists no class. Run 2 (forgetting nothing)
    hears of `cam` again, a fall event: its state lists fall, no feed. Run 3 finds `cam`
    gone (its last message 500 s ago): every topic of it goes, fight's and the feed's too."""
    now = time.time()
    config = MqttConfig(broker=broker.url, client_id="node", topic_prefix="site",
                        forget_after_s=100, discovery=True)
    fight, fall = start("cam", "fight", now - 1000), start("cam", "fall", now - 500)
    first = MqttSink(config)
    try:
        first.send({**fight, "kind": "end", "at": now - 999})  # forgotten at once (quiet)
        assert poll(lambda: "site/cam/class/fight" in retained(broker, "site/cam/class/+"),
                    10) is not None
        first.send({"kind": "feed", "camera": "cam", "state": "blocked", "at": now - 998})
        assert poll(lambda: settled(first), 10) is not None
    finally:
        first.close()
    second = MqttSink(msgspec.structs.replace(config, forget_after_s=0.0))
    try:
        second.send(fall)
        second.send({**fall, "kind": "end", "at": now - 500})
        assert poll(lambda: settled(second), 10) is not None
        assert sorted(retained(broker, "site/cam/+/+")) == [
            "site/cam/class/fall", "site/cam/class/fight"]
        assert "site/cam/feed" in retained(broker, "site/cam/feed")
        assert len(retained(broker, "homeassistant/#")) == 3
    finally:
        second.close()
    third = MqttSink(config)
    try:
        assert poll(lambda: settled(third), 10) is not None
        assert poll(lambda: sorted(retained(broker, "site/#")) == ["site/status"], 10) \
            is not None, retained(broker, "site/#")
        assert retained(broker, "homeassistant/#") == {}
    finally:
        third.close()


@needs_mosquitto
def test_a_camera_only_announced_is_forgotten_on_the_broker_too(broker):
    """A camera that made requests and never an event nor a feed change: its state has no
    message, only when it was announced (`seen`). Gone for 1000 s: removed, topics and all."""
    put_retained(broker, {
        "stgcnd/calm/state": {"camera": "calm", "open": [], "last": None, "classes": ["fall"],
                              "feed": "ok", "seen": time.time() - 1000},
        "stgcnd/calm/class/fall": "OFF", "stgcnd/calm/feed": "ok"})
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="node", forget_after_s=100))
    try:
        assert poll(lambda: sorted(retained(broker, "stgcnd/#")) == ["stgcnd/status"],
                    10) is not None, retained(broker, "stgcnd/#")
    finally:
        sink.close()


@needs_mosquitto
@pytest.mark.slow
def test_a_calm_camera_still_served_is_never_taken_for_one_gone(broker):
    """A camera served for longer than forget_after_s without one message (no event, no feed
    change): the stats ticks say it is still here, so neither the sink's memory nor the next
    run's sync removes it (its Home Assistant entities would vanish). Without them it goes."""
    config = MqttConfig(broker=broker.url, client_id="node", forget_after_s=3.0)
    first = MqttSink(config)
    try:
        first.announce("calm", ["fall"], OK)
        assert poll(lambda: settled(first), 10) is not None
        for _ in range(9):  # 4.5 s, past forget_after_s; the stats tick, every 0.5 s here
            time.sleep(0.5)
            first.still_here(["calm"])
        first.send({"kind": "feed", "camera": "other", "state": OK, "at": time.time()})
        assert poll(lambda: settled(first), 10) is not None
    finally:
        first.close()
    second = MqttSink(config)  # the next run: its sync judges every camera by the broker
    try:
        # its sync over (the retained states read back and judged), then all sent
        assert poll(lambda: second._ever_synced and settled(second), 10) is not None
        assert retained(broker, "stgcnd/calm/class/+") == {"stgcnd/calm/class/fall": b"OFF"}
        time.sleep(3.5)  # no longer served (no still_here): gone after forget_after_s
    finally:
        second.close()
    third = MqttSink(config)
    try:
        assert poll(lambda: "stgcnd/calm/state" not in retained(broker, "stgcnd/#"), 10) \
            is not None, retained(broker, "stgcnd/#")
    finally:
        third.close()


@needs_mosquitto
@pytest.mark.slow
def test_a_daemon_publishes_every_watched_class_and_the_feed_at_a_cameras_first_request(
        tmp_path):
    """Three labels, `normal` quiet: the noop backend's probabilities (1/3 each) never reach
    enter 0.5, so no event at all. After cam0's first request every watched class topic says
    OFF, the feed topic `ok`, with their three discovery configs."""
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker").start()
    models = MODELS.format(broker=broker.url, buffer=1000).replace(
        'labels = ["normal", "shoplifting"]', 'labels = ["normal", "shoplifting", "fall"]')
    assert '"fall"' in models
    d = Daemon(tmp_path, models=models + "discovery = true\n", idle_timeout=600.0,
               feed_intervals=1000)
    expected = {"stgcnd/cam0/class/fall": b"OFF", "stgcnd/cam0/class/shoplifting": b"OFF",
                "stgcnd/cam0/feed": b"ok"}
    try:
        d.start()
        with Client(d.endpoint, camera_id="cam0") as client:
            client.infer(WINDOW, timeout=10.0)
        asked = time.monotonic()
        took = poll(lambda: {**retained(broker, "stgcnd/cam0/+/+"), **retained(
            broker, "stgcnd/cam0/feed")} == expected, 10)
        assert took is not None, retained(broker, "stgcnd/#")
        print(f"\nevery entity of cam0 {time.monotonic() - asked:.2f} s after its request")
        assert len(retained(broker, "homeassistant/#")) == 3
        assert not [e for e in d.log_events() if e.get("event") == "action_event"]
        assert stop_by_pid(d) == 0
    finally:
        stop_by_pid(d)
        broker.stop()
