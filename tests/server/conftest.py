"""Fixtures of the server's tests."""

from __future__ import annotations

import pytest

from stgcnd.server import mqtt_sink
from tests.mosquitto import Broker


@pytest.fixture
def quick_reconnects(monkeypatch):
    """An MQTT sink made in this process reconnects 0.1 s after a failure (doubled up to
    0.4 s), not 1 s (up to 30 s): the same attempts, failures and recoveries, sooner. A
    daemon started as a process keeps the real waits."""
    monkeypatch.setattr(mqtt_sink, "RECONNECT_S", (0.1, 0.4))


@pytest.fixture
def broker(tmp_path):
    """A Mosquitto of the test's own (tests/mosquitto.py), stopped by pid after it."""
    b = Broker(tmp_path).start()
    yield b
    b.stop()
