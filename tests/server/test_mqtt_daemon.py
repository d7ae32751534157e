"""The daemon's events on a real Mosquitto ([events.mqtt]): 16 cameras' events all arrive
exactly once (repeats dropped by mqtt_id, as docs/protocol.md tells a subscriber to) across a
broker restart, and a broker that never answers leaves serving alone."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest

from stgcnd_client import Client
from tests.mosquitto import Broker, Recorder, needs_mosquitto
from tests.server.daemon_harness import Daemon, stop_by_pid

CAMERAS = [f"cam{i}" for i in range(16)]
# The noop backend's zero logits: P(shoplifting) = 0.5 on every window, so a camera's first
# prediction starts an event, which stays open until the camera goes idle (idle_timeout: its
# end, camera-idle, at the next stats tick) or the daemon stops (shutdown). The windows are
# zeros, nobody in them: min_usable = 0 lets them make events.
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
cooldown_s = 0.0
min_usable = 0.0

[events.mqtt]
broker = "{broker}"
client_id = "stgcnd-test"
buffer = {buffer}
"""
WINDOW = np.zeros((3, 30, 33, 1), np.float32)


def infer_all(d: Daemon, rounds: int = 1) -> None:
    for _ in range(rounds):
        for camera in CAMERAS:
            with Client(d.endpoint, camera_id=camera) as client:
                client.infer(WINDOW, timeout=10.0)


def logged(d: Daemon) -> list[tuple[str, str]]:
    return [(e["id"], e["kind"]) for e in d.log_events() if e.get("event") == "action_event"]


@needs_mosquitto
@pytest.mark.slow
def test_sixteen_cameras_events_arrive_exactly_once_across_a_broker_restart(tmp_path):
    (tmp_path / "broker").mkdir()
    broker = Broker(tmp_path / "broker").start()
    recorder = Recorder(broker, "stgcnd/#")
    d = Daemon(tmp_path, models=MODELS.format(broker=broker.url, buffer=10000),
               idle_timeout=1.0, feed_intervals=1000)  # events only, no feed changes
    try:
        d.start()
        for n in range(6):   # a start and an end (camera-idle) per camera a round
            if n == 2:
                broker.stop()    # the rounds 2 and 3 and their ends wait in the daemon
            infer_all(d)
            if n == 3:
                broker.start()
            time.sleep(2.5)  # idle_timeout, then the tick that forgets the cameras
        infer_all(d)         # open at the shutdown: ended by it
        with Client(d.endpoint, camera_id="stats") as client:
            stats = client.stats()["events_mqtt"]
        assert stop_by_pid(d) == 0
        sent = logged(d)
        got = recorder.wait_for(len(sent), timeout=30)
        arrived = [(e["id"], e["kind"]) for e in got]
        assert sorted(arrived) == sorted(sent) and len(set(arrived)) == len(arrived)
        assert len(sent) == 16 * 6 * 2 + 16 * 2
        assert stats["dropped"] == 0 and stats["connects"] == 2
        reconnect = [e for e in d.log_events() if e.get("event") == "mqtt_connected"][1]
        assert reconnect["buffered"] >= 16 * 3   # rounds 2 and 3 waited in the daemon
        # The retained states, to a subscriber that comes later: every event ended.
        late = Recorder(broker, "stgcnd/+/state", client_id="late")
        end = time.monotonic() + 10
        while len(late.messages) < 16 and time.monotonic() < end:
            time.sleep(0.05)
        states = {t: json.loads(p) for t, p, _ in late.messages}
        late.close()
        assert sorted(states) == sorted(f"stgcnd/{c}/state" for c in CAMERAS)
        assert all(s["open"] == [] and s["last"]["reason"] == "shutdown"
                   for s in states.values())
        print(f"\n16 cameras, a broker restart: {len(sent)} events logged, {len(arrived)} "
              f"arrived once each, {recorder.duplicates} repeats dropped by mqtt_id, "
              f"{stats['dropped']} dropped")
    finally:
        stop_by_pid(d)
        recorder.close()
        broker.stop()


@needs_mosquitto
@pytest.mark.slow
def test_a_broker_that_never_answers_leaves_serving_alone(tmp_path):
    """A listener that takes the connection and never answers CONNECT: the daemon starts,
    answers every request of 16 cameras, keeps the events buffered (bounded), and stops at
    once."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(silent.accept()[0]), daemon=True).start()
    port = silent.getsockname()[1]
    d = Daemon(tmp_path, models=MODELS.format(broker=f"mqtt://127.0.0.1:{port}", buffer=8),
               feed_intervals=1000)
    try:
        d.start()
        began = time.monotonic()
        infer_all(d, rounds=20)     # 320 requests, each answered within its 10 s timeout
        served_s = time.monotonic() - began
        with Client(d.endpoint, camera_id="stats") as client:
            stats = client.stats()["events_mqtt"]
        assert held, "the daemon never connected to the silent broker"
        assert (stats["connected"], stats["in_flight"], stats["delivered"]) == (False, 0, 0)
        assert (stats["buffered"], stats["dropped"]) == (8 + 16, 16 - 8)
        stopping = time.monotonic()
        assert stop_by_pid(d) == 0
        print(f"\nsilent broker: 320 requests in {served_s:.2f} s; stop took "
              f"{time.monotonic() - stopping:.2f} s")
        unsent = [e for e in d.log_events() if e.get("event") == "mqtt_unsent"]
        assert unsent and unsent[0]["connected"] is False
    finally:
        stop_by_pid(d)
        silent.close()
        for conn in held:
            conn.close()
