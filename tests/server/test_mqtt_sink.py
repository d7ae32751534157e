"""The MQTT sink (server/mqtt_sink.py) against a real Mosquitto: what arrives where, a broker
restart in the middle, the bounded buffer, and a broker that never answers. The daemon's own
run (16 cameras, a restart) is tests/server/test_mqtt_daemon.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from stgcnd.errors import UserError
from stgcnd.server.config import MqttConfig, check_files, load_config
from stgcnd.server.mqtt_sink import MqttSink
from stgcnd.server.server import keep_restart_keys
from tests.mosquitto import Recorder, needs_mosquitto

# In-process sinks reconnect sooner (tests/server/conftest.py).
pytestmark = pytest.mark.usefixtures("quick_reconnects")


def event(camera: str, kind: str, n: int) -> dict[str, object]:
    return {"kind": kind, "id": f"{camera}/demo/1/{n}", "camera": camera, "class": "theft"}


def wait(predicate, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while not predicate() and time.monotonic() < end:
        time.sleep(0.05)
    return predicate()


@needs_mosquitto
def test_camera_ids_a_broker_refuses_in_a_topic_are_escaped_and_cut_nothing(broker):
    """Issue #41 (found by tests/server/test_property_fuzz.py): a camera id with a control
    character or a Unicode non-character made a topic Mosquitto takes for malformed UTF-8: it
    cut the connection at that message, and the sink resent it at every reconnect, so one
    client's camera id held back every camera's events."""
    odd = ["c\x01", "c\x1f", "c\x7f", "c\x85", "c\ufdd0", "c\uffff", "c\U0001fffe"]
    recorder = Recorder(broker, "site/#")
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-odd", topic_prefix="site"))
    try:
        for n, camera in enumerate([*odd, "door-1"]):
            sink.send(event(camera, "start", n))
        got = recorder.wait_for(len(odd) + 1, timeout=10)
        assert [e["camera"] for e in got] == [*odd, "door-1"]
        topics = [t for t, _, _ in recorder.messages if t.endswith("/event")]
        assert topics[:2] == ["site/c%01/event", "site/c%1F/event"]
        assert topics[3:6] == ["site/c%C2%85/event", "site/c%EF%B7%90/event",
                               "site/c%EF%BF%BF/event"]
        assert sink.stats()["connects"] == 1
    finally:
        sink.close()
        recorder.close()


@needs_mosquitto
def test_events_arrive_on_the_camera_topic_and_its_state_is_retained(broker):
    recorder = Recorder(broker, "site/#")
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-a", topic_prefix="site"))
    try:
        sink.send(event("door/1", "start", 1))
        sink.send(event("door/1", "end", 1))
        sink.send({"kind": "heartbeat"})   # a message about no camera: PREFIX/event
        got = recorder.wait_for(3)
        assert [(e["kind"], e["mqtt_id"].split("-")[1]) for e in got] == [
            ("start", "1"), ("end", "2"), ("heartbeat", "3")]
        topics = [t for t, _, _ in recorder.messages if t.endswith("/event")]
        assert topics == ["site/door%2F1/event"] * 2 + ["site/event"]   # / escaped in a level
        assert wait(lambda: sink.stats()["in_flight"] == 0)
        # A late subscriber gets the camera's state at once (retained): nothing open now.
        late = Recorder(broker, "site/+/state", client_id="late")
        assert wait(lambda: late.messages)
        topic, payload, retained = late.messages[0]
        state = json.loads(payload)
        assert (topic, retained, state["open"], state["last"]["kind"]) == (
            "site/door%2F1/state", True, [], "end")
        late.close()
        stats = sink.stats()
        assert (stats["connected"], stats["dropped"], stats["buffered"]) == (True, 0, 0)
    finally:
        sink.close()
        recorder.close()


@needs_mosquitto
def test_a_broker_restart_in_the_middle_loses_nothing_within_the_buffer(broker):
    """16 cameras send while the broker stops and starts again (SIGTERM: it saves its
    sessions): every message arrives, once a subscriber has dropped the repeats by mqtt_id,
    in order per camera."""
    recorder = Recorder(broker)
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-b", buffer=1000))
    cameras = [f"cam{i}" for i in range(16)]
    try:
        assert wait(lambda: sink.stats()["connected"])
        sent = 0
        for phase in ("up", "down", "up again"):
            if phase == "down":
                broker.stop()
                assert wait(lambda: not sink.stats()["connected"])
            elif phase == "up again":
                broker.start()
            for n in range(10):
                for camera in cameras:
                    sink.send(event(camera, "start" if n % 2 == 0 else "end", sent))
                    sent += 1
                time.sleep(0.02)
        got = recorder.wait_for(sent, timeout=60)
        assert len(got) == sent, f"{len(got)} of {sent} arrived"
        numbers = sorted(int(e["mqtt_id"].split("-")[1]) for e in got)
        assert numbers == list(range(1, sent + 1))
        for camera in cameras:
            mine = [int(e["id"].split("/")[-1]) for e in got if e["camera"] == camera]
            assert mine == sorted(mine)
        stats = sink.stats()
        assert stats["dropped"] == 0 and stats["connects"] == 2
        print(f"\n{sent} messages across a broker restart: {len(got)} arrived, "
              f"{recorder.duplicates} duplicates dropped by mqtt_id, {stats['dropped']} dropped")
    finally:
        sink.close()
        recorder.close()


@needs_mosquitto
def test_a_full_buffer_drops_the_oldest_and_counts_them(broker):
    recorder = Recorder(broker)   # subscribed, then away with the broker: its session stays
    broker.stop()
    sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-c", buffer=50))
    try:
        for n in range(80):
            sink.send(event("cam1", "start", n))
        stats = sink.stats()
        assert (stats["connected"], stats["dropped"], stats["buffered"]) == (False, 30, 51)
        broker.start()   # 50 events and cam1's state
        got = recorder.wait_for(50)
        assert [int(e["mqtt_id"].split("-")[1]) for e in got] == list(range(31, 81))
    finally:
        sink.close()
        recorder.close()


@needs_mosquitto
def test_a_broker_that_never_answers_never_holds_up_send(tmp_path):
    """A TCP listener that takes the connection and never answers CONNECT: send() still only
    buffers (nothing is handed to paho without a CONNACK), the buffer stays bounded, and close
    does not wait for the broker."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    accepted: list[bytes] = []

    def take() -> None:
        conn, _ = silent.accept()
        accepted.append(conn.recv(64))   # the CONNECT, never answered
        time.sleep(30)
        conn.close()

    threading.Thread(target=take, daemon=True).start()
    port = silent.getsockname()[1]
    sink = MqttSink(MqttConfig(broker=f"mqtt://127.0.0.1:{port}", client_id="sink-d",
                               buffer=1000))
    try:
        assert wait(lambda: accepted)
        assert accepted[0][:1] == b"\x10"            # CONNECT went out; no CONNACK came
        for n in range(10_000):   # each camera's events start and end in turn
            sink.send(event(f"cam{n % 16}", "end" if n // 16 % 2 else "start", n // 32))
        stats = sink.stats()
        assert (stats["connected"], stats["in_flight"], stats["delivered"]) == (False, 0, 0)
        assert (stats["dropped"], stats["buffered"]) == (9_000, 1_000 + 16)
    finally:
        closing = time.monotonic()
        sink.close()
        silent.close()
    print(f"\nclose() with a silent broker: {time.monotonic() - closing:.2f} s")


def write(tmp: Path, mqtt: str) -> Path:
    path = tmp / "stgcnd.toml"
    path.write_text("[[models]]\ndemo = true\n\n[events.mqtt]\n" + textwrap.dedent(mqtt))
    return path


@pytest.mark.parametrize(("mqtt", "message"), [
    ('broker = "tcp://h:1883"\n', "broker must be mqtt://HOST"),
    ('broker = "mqtt://h:99999"\n', "broker must be mqtt://HOST"),
    ('broker = "mqtt://h"\nca_file = "ca.pem"\n', "write the broker as mqtts://"),
    ('broker = "mqtt://h"\npassword_file = "pw"\n', "password_file needs username"),
    ('broker = "mqtt://h"\ntopic_prefix = "a/#"\n', "without + or #"),
    ('broker = "mqtt://h"\nqos = 3\n', "qos must be 0, 1 or 2"),
    ('broker = "mqtt://h"\nport = 1\n', "unknown key"),
    ('', "broker must be mqtt://HOST"),
])
def test_bad_mqtt_settings_are_refused_with_the_fix(tmp_path, mqtt, message):
    with pytest.raises(UserError, match=message.replace("+", r"\+")):
        load_config(write(tmp_path, mqtt), env={})


def test_mqtts_files_are_relative_to_the_config_and_must_exist(tmp_path):
    config = load_config(write(tmp_path, """\
        broker = "mqtts://broker.example"
        username = "cam"
        password_file = "secret"
        ca_file = "ca.pem"
    """), env={})
    mqtt = config.events.mqtt
    assert mqtt is not None and mqtt.address == ("broker.example", 8883, True)
    assert mqtt.password_file == str(tmp_path / "secret")
    assert load_config(None, env={}).events.mqtt is None   # none without the table
    with pytest.raises(UserError, match=r"\[events.mqtt\] password_file not found.*ca_file"):
        check_files(config)


def test_a_reload_keeps_the_running_mqtt_table(tmp_path):
    """Its keys are restart keys: the reloaded config keeps the sink's table (and the reload
    logs reload_key_ignored)."""
    running = load_config(write(tmp_path, 'broker = "mqtt://a"\n'), env={})
    reread = load_config(write(tmp_path, 'broker = "mqtt://b"\nqos = 0\n'), env={})
    assert keep_restart_keys(reread, running).events == running.events


def test_serving_without_the_table_never_loads_paho():
    code = ("import sys, stgcnd.commands.serve, stgcnd.server.server; "
            "print(sorted(m for m in sys.modules if m.startswith(('paho', 'stgcnd.server.mqtt'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_an_unreadable_password_or_a_bad_certificate_is_said_at_start(tmp_path):
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    for config in (MqttConfig(broker="mqtt://127.0.0.1", username="u",
                              password_file=str(tmp_path)),     # a directory
                   MqttConfig(broker="mqtts://127.0.0.1", ca_file=str(tmp_path / "ca.pem"))):
        with pytest.raises(UserError, match=r"\[events.mqtt\]: .*fix the file"):
            MqttSink(config)
