"""Every events subscriber of the docs runs as written (issue #42: the documented MQTT
subscriber crashed on feed messages and crash-looped; the ZeroMQ ones ended at a daemon
restart). A block is found by its marker, `<!-- subscriber: ... -->`, in README.md or docs/;
one that talks to a daemon or a broker without it fails here, so a new example cannot be
missed. Each runs in its own process, only its address changed (and, for CURVE, its key
files put where it names them), against a real daemon (and a real Mosquitto for paho): an
action event's start and end, feed health changes, the daemon stopped and started again, the
next run's start and end; and it is still running at the end."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from stgcnd.cli import main as stgcnd
from stgcnd_client import Client
from tests.conftest import REPO
from tests.mosquitto import Broker, free_port, needs_mosquitto
from tests.server.daemon_harness import Daemon, stop_by_pid

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = "<!-- subscriber:"
BLOCK = re.compile(r"^(<!--[^\n]*-->\n)?```python\n(.*?)^```", re.M | re.S)
TALKS = re.compile(r"\bEvents\(|zmq\.SUB|paho")  # a block that subscribes to a daemon/broker
CAMERA = "door-1"  # the camera the examples filter on, where they do
# The noop backend's zero logits: P(shoplifting) = 0.5, so a camera's first window starts an
# event (open until the shutdown ends it); the zero windows show nobody, so its feed goes
# no-person at the next stats tick (feed_intervals = 1).
MODELS = """[[models]]
name = "demo"
backend = "noop"
demo = true
frames = 30
labels = ["normal", "shoplifting"]
[models.events]
enter = 0.5
exit = 0.4
min_duration_s = 0.0
min_usable = 0.0
"""
WINDOW = np.zeros((3, 30, 33, 1), np.float32)


@dataclass(frozen=True)
class Example:
    where: str   # file:line
    code: str
    marked: bool

    @property
    def mqtt(self) -> bool:
        return "paho" in self.code


def examples() -> list[Example]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            if TALKS.search(m.group(2)):
                line = text.count("\n", 0, m.start(2))
                found.append(Example(f"{doc.relative_to(REPO)}:{line}", m.group(2),
                                     (m.group(1) or "").startswith(MARKER)))
    return found


def test_every_subscriber_example_is_marked_to_run():
    found = examples()
    assert {e.where.split(":")[0] for e in found} >= {
        "README.md", "docs/protocol.md", "docs/remote-cameras.md"}, found
    unmarked = [e.where for e in found if not e.marked]
    assert not unmarked, f"mark these with {MARKER} ... --> (and make them run): {unmarked}"


class Running:
    """The example in its own process; its printed lines, read as they come."""

    def __init__(self, script: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(script)], cwd=script.parent,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def said(self, *words: str) -> int:
        """Lines with every word of `words` (a word "a|b": either)."""
        return sum(1 for line in list(self.lines)
                   if all(set(w.split("|")) & set(line.split()) for w in words))

    def wait_for(self, count: int, *words: str, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while self.said(*words) < count and time.monotonic() < end:
            assert self.proc.poll() is None, "the example died:\n" + "\n".join(self.lines)
            time.sleep(0.05)
        assert self.said(*words) >= count, (words, count, self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


def _key(config: Path, name: str, out: Path) -> Path:
    assert stgcnd(["keys", "--config", str(config), "create", name, "--out", str(out)]) == 0
    return out / f"{name}.key_secret"


@needs_mosquitto
@pytest.mark.slow
@pytest.mark.parametrize("example", examples(), ids=lambda e: e.where)
def test_the_example_runs_through_feed_messages_and_a_daemon_restart(tmp_path, example):
    work = tmp_path / "example"
    work.mkdir()
    code, config, broker = example.code, {}, None
    client_keys: dict[str, str] = {}
    if example.mqtt:
        (tmp_path / "broker").mkdir()
        broker = Broker(tmp_path / "broker").start()
        code = re.sub(r'\.connect\("[^"]+", \d+\)', f'.connect("127.0.0.1", {broker.port})',
                      code)
        models = MODELS + f'\n[events.mqtt]\nbroker = "{broker.url}"\n'
    else:
        models = MODELS
        endpoint = f"ipc://{tmp_path / 'events.sock'}"
        if "server_key=" in code:   # CURVE: the daemon's keys, the subscriber's in its files
            endpoint = f"tcp://127.0.0.1:{free_port()}"
            config = {"endpoint": f"tcp://127.0.0.1:{free_port()}", "curve": "on",
                      "keys_dir": str(tmp_path / "keys")}
        config["events_endpoint"] = endpoint
        code = re.sub(r'Events\("[^"]+"', f'Events("{endpoint}"', code)
    d = Daemon(tmp_path, models=models, feed_intervals=1, events_heartbeat_s=0.5, **config)
    if "server_key=" in code:
        server_file = re.search(r'server_key="([^"]+)"', code)
        client_file = re.search(r'client_key="([^"]+)"', code)
        assert server_file and client_file, "name the key files as strings"
        secret = _key(d.config_path, "alarm-box", tmp_path / "out")
        shutil.copy(secret, work / client_file.group(1))
        keys_at = (tmp_path / "keys" / "server.key", work / server_file.group(1))
        client_keys = {"server_key": str(keys_at[0]), "client_key": str(secret)}
    script = work / "subscriber.py"
    script.write_text(code)
    sub = Running(script) if example.mqtt else None
    try:
        if example.mqtt:
            time.sleep(2.0)  # its first connect subscribes; the session keeps it from then on
        d.start()
        if client_keys:   # the daemon's public key, made at its first start
            shutil.copy(*keys_at)
        sub = sub or Running(script)
        for run in (1, 2):
            time.sleep(1.5)  # a SUB socket's subscription reaches the (restarted) daemon
            with Client(d.endpoint, camera_id=CAMERA, **client_keys) as client:
                client.infer(WINDOW, timeout=10.0)
                # A subscription that reaches the daemon after the start gets the event as
                # a snapshot (the ZeroMQ examples print both; MQTT has no snapshots).
                sub.wait_for(run, "start|snapshot")
                if example.mqtt:   # feed messages on the same topic
                    sub.wait_for(run, CAMERA, "feed", "no-person")
                else:
                    time.sleep(1.5)  # the feed's change goes out (the client skips it)
            assert stop_by_pid(d) == 0
            sub.wait_for(run, "end")   # the shutdown's end
            if run == 1:
                d = Daemon(tmp_path, config_path=d.config_path, endpoint=d.endpoint).start()
        time.sleep(0.5)
        assert sub.proc.poll() is None, "\n".join(sub.lines)
        print(f"\n{example.where}:\n" + "\n".join(sub.lines))
    finally:
        stop_by_pid(d)
        if sub is not None:
            sub.stop()
        if broker is not None:
            broker.stop()
