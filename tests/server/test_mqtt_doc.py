"""docs/protocol.md §12's MQTT subscriber, run as written (only the broker's address changed)
against a real daemon and a real Mosquitto (issue #42, item 2): it gets an action event's
start and end and a feed's health change on the same topic, survives a restart of the daemon
and one of its own (a persistent session: the broker keeps what came meanwhile), and is
still running at the end: a message kind it does not expect never crashes it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stgcnd_client import Client
from tests.conftest import REPO
from tests.mosquitto import Broker, needs_mosquitto
from tests.server.daemon_harness import Daemon, stop_by_pid
from tests.server.test_doc_examples import MODELS as EXAMPLE_MODELS
from tests.server.test_doc_examples import WINDOW

DOC = REPO / "docs" / "protocol.md"
CONNECT = 'client.connect("broker.example", 1883)'
# test_doc_examples' noop model (every first window starts an event, the feed goes no-person
# at the first stats tick), with updates each second and the broker.
MODELS = EXAMPLE_MODELS + """update_interval_s = 1.0

[events.mqtt]
broker = "{broker}"
client_id = "stgcnd-doc-test"
"""


def subscriber_example() -> str:
    """§12's subscriber: the python block that imports paho."""
    text = DOC.read_text()
    section = re.search(r"^## 12\. .*?(?=^## |\Z)", text, re.M | re.S)
    assert section, "docs/protocol.md has no section 12"
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section.group(0), re.S)
              if "paho" in b]
    assert len(blocks) == 1, "§12 should have one MQTT subscriber example"
    assert CONNECT in blocks[0], f"the example should connect with {CONNECT}"
    return blocks[0]


class Subscriber:
    """The example in its own process; its printed lines, read as they come."""

    def __init__(self, script: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, line: str, count: int, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while self.lines.count(line) < count and time.monotonic() < end:
            assert self.proc.poll() is None, "the example died:\n" + "\n".join(self.lines)
            time.sleep(0.05)
        assert self.lines.count(line) >= count, (line, count, self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


@needs_mosquitto
@pytest.mark.slow
def test_the_docs_mqtt_subscriber_runs_through_feed_messages_and_restarts(tmp_path):
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker").start()
    script = tmp_path / "subscriber.py"
    script.write_text(subscriber_example().replace(
        CONNECT, f'client.connect("127.0.0.1", {broker.port})'))
    sub = Subscriber(script)
    d = Daemon(tmp_path, models=MODELS.format(broker=broker.url), feed_intervals=1)
    try:
        time.sleep(2.0)  # its first connect subscribes; the session keeps it from then on
        d.start()
        with Client(d.endpoint, camera_id="door") as client:
            client.infer(WINDOW, timeout=10.0)
            sub.wait_for("door start shoplifting", 1)
            sub.wait_for("door feed no-person", 1)  # the next stats tick
            time.sleep(1.0)
            client.infer(WINDOW, timeout=10.0)  # a second past the start: an update
            sub.wait_for("door update shoplifting", 1)
        assert stop_by_pid(d) == 0
        sub.wait_for("door end shoplifting", 1)  # the shutdown's end
        sub.stop()  # away while the daemon runs again: its session keeps the messages
        d = Daemon(tmp_path, config_path=d.config_path).start()
        with Client(d.endpoint, camera_id="door") as client:
            client.infer(WINDOW, timeout=10.0)
            time.sleep(2.5)  # the new run's feed change
        assert stop_by_pid(d) == 0
        sub = Subscriber(script)
        for line in ("door start shoplifting", "door feed no-person",
                     "door end shoplifting"):
            sub.wait_for(line, 1)
        time.sleep(0.5)
        assert sub.proc.poll() is None, "\n".join(sub.lines)
    finally:
        stop_by_pid(d)
        sub.stop()
        broker.stop()
