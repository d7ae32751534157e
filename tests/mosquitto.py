"""A real Mosquitto broker for the MQTT tests: its own config file, a free port on loopback,
persistence in the test's directory (so that a restart keeps sessions, queued messages and
retained ones, as a site's broker with `persistence true` does), stopped by its pid. Never the
system's service. Tests skip, saying why, where the `mosquitto` package is not installed
(.ci/run installs it), and a subscriber that records what arrives."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

MOSQUITTO = shutil.which("mosquitto") or next(
    (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).is_file()), None)
needs_mosquitto = pytest.mark.skipif(
    MOSQUITTO is None, reason="the Debian package mosquitto is not installed (.ci/run installs "
                              "it: apt-get install mosquitto)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    def __init__(self, tmp: Path, passwords: dict[str, str] | None = None) -> None:
        """`passwords`: user -> password, the only clients let in (else anyone is)."""
        assert MOSQUITTO is not None
        self.dir, self.port = tmp, free_port()
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.config = tmp / "mosquitto.conf"
        # max_queued_messages 0: no limit on what a subscriber offline across the restart
        # gets queued (the default, 1000, would drop the rest of a long test's messages).
        # user: as root, mosquitto would become user mosquitto, who cannot write here.
        self.config.write_text(
            f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
            f"listener {self.port} 127.0.0.1\n{self._access(passwords)}persistence true\n"
            f"persistence_location {tmp}/\nmax_queued_messages 0\n"
            f"log_dest file {tmp}/mosquitto.log\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def _access(self, passwords: dict[str, str] | None) -> str:
        if passwords is None:
            return "allow_anonymous true\n"
        path = self.dir / "passwords"
        path.write_text("")
        for user, password in passwords.items():  # mosquitto_passwd hashes them
            subprocess.run(["mosquitto_passwd", "-b", str(path), user, password], check=True)
        return f"allow_anonymous false\npassword_file {path}\n"

    def start(self) -> Broker:
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            assert self.proc.poll() is None, (self.dir / "mosquitto.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError("mosquitto did not listen within 10 s")

    def stop(self) -> None:
        """SIGTERM (it saves its database), by pid."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Recorder:
    """A subscriber with a persistent session (clean_session off, QoS 1): the broker keeps
    what arrives for it while it is away, across a restart. Drops a seen mqtt_id as
    docs/protocol.md says a subscriber must, and counts each one it dropped."""

    def __init__(self, broker: Broker, topic: str = "#", client_id: str = "recorder") -> None:
        self.messages: list[tuple[str, bytes, bool]] = []  # (topic, payload, retained)
        self.seen: set[str] = set()
        self.duplicates = 0
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  clean_session=False, protocol=mqtt.MQTTv311)
        self.client.reconnect_delay_set(0.1, 0.5)  # back soon after a broker restarted
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        assert self.subscribed.wait(10), "no SUBACK"

    def _on_message(self, client: mqtt.Client, userdata: object, msg: mqtt.MQTTMessage) -> None:
        # PREFIX/status is `online`/`offline`, and a removed retained topic comes empty
        body = json.loads(msg.payload) if msg.payload.startswith(b"{") else {}
        with self.lock:
            key = body.get("mqtt_id")
            if key is not None and key in self.seen:
                self.duplicates += 1
                return
            if key is not None:
                self.seen.add(key)
            self.messages.append((msg.topic, msg.payload, bool(msg.retain)))

    def retained(self) -> dict[str, bytes]:
        """Topic -> the last retained payload that came (b"": the topic was removed)."""
        with self.lock:
            return {t: p for t, p, retained in self.messages if retained}

    def events(self) -> list[dict]:
        with self.lock:
            return [json.loads(p) for t, p, _ in self.messages if t.endswith("/event")]

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict]:
        end = time.monotonic() + timeout
        while len(self.events()) < count and time.monotonic() < end:
            time.sleep(0.05)
        return self.events()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
