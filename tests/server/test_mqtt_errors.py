"""Why the broker cannot be reached (server/mqtt_errors.py, the sink's connect path), against a
real Mosquitto and real sockets: one `mqtt_unreachable` line a change of reason, whatever the
retries, with the fix; one `mqtt_recovered` line when a connection succeeds (issue #42: a wrong
password logged `mqtt_refused` at every retry, and an unreachable broker no reason)."""

from __future__ import annotations

import errno
import socket
import threading
import time

import pytest
from structlog.testing import capture_logs

from stgcnd.server.config import MqttConfig
from stgcnd.server.mqtt_errors import REASONS, why_failed
from stgcnd.server.mqtt_sink import KEEPALIVE_S, MqttSink
from tests.mosquitto import Broker, free_port, needs_mosquitto

# In-process sinks reconnect sooner (tests/server/conftest.py).
pytestmark = pytest.mark.usefixtures("quick_reconnects")


def wait(predicate, timeout: float = 20.0) -> bool:
    end = time.monotonic() + timeout
    while not predicate() and time.monotonic() < end:
        time.sleep(0.05)
    return predicate()


def lines(logs: list[dict], event: str) -> list[dict]:
    return [line for line in logs if line["event"] == event]


def refusals(broker: Broker) -> int:
    """The connections the broker refused for their credentials, as its log says."""
    log = broker.dir / "mosquitto.log"
    return log.read_text().count("not authorised") if log.exists() else 0


@needs_mosquitto
def test_a_wrong_password_is_said_once_however_many_retries(tmp_path):
    broker = Broker(tmp_path, passwords={"cam": "right"}).start()
    (tmp_path / "password").write_text("wrong\n")
    try:
        with capture_logs() as logs:
            sink = MqttSink(MqttConfig(broker=broker.url, username="cam", client_id="sink-pw",
                                       password_file=str(tmp_path / "password")))
            try:   # paho retries 0.1, 0.2, 0.4 s apart here (quick_reconnects)
                assert wait(lambda: refusals(broker) >= 3, timeout=15), refusals(broker)
            finally:
                sink.close()
        said = lines(logs, "mqtt_unreachable")
        assert [line["reason"] for line in said] == ["auth"], said
        assert "username/password_file" in said[0]["fix"]
        assert said[0]["error"] == "CONNACK: Not authorized"   # Mosquitto 2's answer
        assert not lines(logs, "mqtt_refused") and not lines(logs, "mqtt_recovered")
    finally:
        broker.stop()


@needs_mosquitto
def test_nothing_listening_is_refused_and_the_broker_coming_is_a_recovery(tmp_path):
    broker = Broker(tmp_path)   # its port, nothing listening on it yet
    with capture_logs() as logs:
        sink = MqttSink(MqttConfig(broker=broker.url, client_id="sink-refused"))
        try:
            assert wait(lambda: lines(logs, "mqtt_unreachable"), timeout=10)
            broker.start()
            assert wait(lambda: sink.stats()["connected"], timeout=40)
        finally:
            sink.close()
            broker.stop()
    said = lines(logs, "mqtt_unreachable")
    assert [line["reason"] for line in said] == ["refused"], said
    assert "Connection refused" in said[0]["error"]
    recovered = lines(logs, "mqtt_recovered")
    assert len(recovered) == 1 and recovered[0]["reason"] == "refused"
    assert recovered[0]["failed_attempts"] >= 1 and recovered[0]["unreachable_s"] > 0
    events = [line["event"] for line in logs]
    assert events.index("mqtt_recovered") < events.index("mqtt_connected")


def test_a_host_name_that_does_not_resolve_is_dns():
    with capture_logs() as logs:
        sink = MqttSink(MqttConfig(broker="mqtt://nonexistent.invalid", client_id="sink-dns"))
        try:
            assert wait(lambda: lines(logs, "mqtt_unreachable"), timeout=15)
        finally:
            sink.close()
    said = lines(logs, "mqtt_unreachable")
    assert [line["reason"] for line in said] == ["dns"], said
    assert said[0]["fix"] == REASONS["dns"]


@needs_mosquitto
def test_tls_to_a_plain_port_is_tls(tmp_path):
    """mqtts:// to Mosquitto's plain listener: it reads the ClientHello as a malformed MQTT
    packet and resets the connection within the handshake: `tls` (not a timeout)."""
    broker = Broker(tmp_path).start()
    try:
        with capture_logs() as logs:
            sink = MqttSink(MqttConfig(broker=f"mqtts://127.0.0.1:{broker.port}",
                                       client_id="sink-tls"))
            try:
                assert wait(lambda: lines(logs, "mqtt_unreachable"), timeout=15)
            finally:
                sink.close()
    finally:
        broker.stop()
    said = lines(logs, "mqtt_unreachable")
    assert [line["reason"] for line in said] == ["tls"], said
    assert "ca_file" in said[0]["fix"]


@pytest.mark.slow
def test_a_tls_handshake_never_answered_is_a_timeout():
    """A listener that takes the connection and never answers the ClientHello: paho gives up
    after its 5 s connect timeout (paho 2.1, the one pip gives Python 3.8, times the TLS
    handshake by the keepalive instead: 30 s)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    taken: list[socket.socket] = []
    threading.Thread(target=lambda: [taken.append(silent.accept()[0]) for _ in range(4)],
                     daemon=True).start()
    try:
        with capture_logs() as logs:
            sink = MqttSink(MqttConfig(broker=f"mqtts://127.0.0.1:{silent.getsockname()[1]}",
                                       client_id="sink-timeout"))
            try:
                assert wait(lambda: lines(logs, "mqtt_unreachable"), timeout=KEEPALIVE_S + 15)
            finally:
                sink.close()
    finally:
        silent.close()
        for conn in taken:
            conn.close()
    assert [line["reason"] for line in lines(logs, "mqtt_unreachable")] == ["timeout"]


def test_a_connection_this_host_forbids_is_blocked():
    """systemd's IPAddressDeny answers connect() with EPERM (not reproducible without
    systemd): `blocked`, with the unit's setting to change."""
    try:
        socket.create_connection(("127.0.0.1", free_port()), timeout=1)
    except ConnectionRefusedError as refused:
        assert why_failed(refused, tls=False) == "refused"
    assert why_failed(PermissionError(errno.EPERM, "Operation not permitted"), tls=False) \
        == "blocked"
    assert "IPAddressAllow" in REASONS["blocked"]
