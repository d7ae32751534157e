"""Issue #34, feeds that went bad: against a real `stgcnd serve` (stats every 0.25 s), cameras
sending coordinates in [-3, 3], NaN frames, empty skeletons, too fast for their queue, or
nothing any more each get a `feed` event on the events socket, a `feed_health` warning in
the log and their state in `stats`; a camera that sends good frames again gets its recovery
(state ok, logged at info). Before #34 none of them was said anywhere but a share in the
log, and the NaN camera was not even a camera. The daemon is stopped by pid."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from stgcnd_client import Client, Events
from stgcnd_client.errors import ServerError
from stgcnd_client.wire import encode_request
from tests.server.daemon_harness import Daemon, stop_by_pid, write_config

MODEL = ('[[models]]\nname = "m"\ndemo = true\nbackend = "noop"\nframes = 30\nstride = 5\n'
         'noop_compute_us = 20000\n')
RNG = np.random.default_rng(34)


def frame(kind: str) -> np.ndarray:
    f = np.zeros((3, 33, 1), np.float32)
    if kind == "empty":
        return f                                    # visibility 0: nobody
    low, high = (-3.0, 3.0) if kind == "garbage" else (0.2, 0.8)
    f[:2] = RNG.uniform(low, high, (2, 33, 1))
    f[2] = 0.9
    if kind == "nan":
        f[0, 5] = np.nan
    return f


def push(client: Client, kind: str) -> None:
    try:
        client.push(frame(kind))
    except ServerError:
        assert kind == "nan"


@pytest.fixture
def daemon(tmp_path):
    endpoint = f"ipc://{tmp_path / 'events.sock'}"
    config = write_config(tmp_path / "stgcnd.toml", f"ipc://{tmp_path / 'd.sock'}",
                          tmp_path / "engines", MODEL, events_endpoint=endpoint,
                          feed_intervals=2, queue_size=1)
    config.write_text(config.read_text().replace("stats_interval = 1.0", "stats_interval = 0.25"))
    d = Daemon(tmp_path, config_path=config)
    d.start()
    yield d, endpoint
    stop_by_pid(d)


@pytest.mark.slow
def test_each_bad_feed_is_said_once_on_the_socket_in_the_log_and_in_stats(daemon):
    d, endpoint = daemon
    kinds = {"garbage": "garbage", "nan": "nan", "empty": "empty", "stopper": "good"}
    changes: list[dict] = []
    with Events(endpoint, feeds=True) as events, \
            Client(d.endpoint, camera_id="watcher") as watcher, \
            zmq.Context() as ctx, ctx.socket(zmq.DEALER) as flood:
        flood.connect(d.endpoint)
        clients = {c: Client(d.endpoint, camera_id=c) for c in kinds}
        window = np.tile(frame("good")[:, None], (1, 30, 1, 1))
        sent = 0

        def run(seconds: float) -> None:
            nonlocal sent
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for camera, kind in kinds.items():
                    push(clients[camera], kind)
                for _ in range(4):  # four windows at once on a queue of one: three refused
                    sent += 1
                    flood.send_multipart(encode_request("infer", sent, "flood", arrays=[window]))
                while flood.poll(0):
                    flood.recv_multipart()
                while (event := events.recv(timeout_ms=5)) is not None:
                    if event["kind"] == "feed":
                        changes.append(event)

        run(2.0)
        feeds = watcher.stats()["feeds"]
        kinds.update(garbage="good")        # the garbage camera mends, the stopper stops
        del kinds["stopper"]
        run(2.0)
        after = watcher.stats()["feeds"]
        for client in clients.values():
            client.close()

    said = [(e["camera"], e["previous"], e["state"]) for e in changes]
    assert said == sorted(set(said), key=said.index), said         # each change said once
    for camera, state in [("garbage", "out-of-frame"), ("nan", "refused"),
                          ("empty", "no-person"), ("flood", "blocked")]:
        assert (camera, "ok", state) in said, said
        assert feeds[camera]["state"] == state, feeds
    assert ("garbage", "out-of-frame", "ok") in said and ("stopper", "ok", "silent") in said
    assert after["garbage"]["state"] == "ok" and after["stopper"]["state"] == "silent", after
    assert not any(camera == "watcher" for camera, _, _ in said)    # stats only: no frames
    garbage = next(e for e in changes if e["camera"] == "garbage")
    assert garbage["share"] > 0.9 and garbage["frames"] > 0 and garbage["seq"] > 0

    assert d.stop() == 0
    lines = [e for e in d.log_events() if e.get("event") == "feed_health"]
    assert [(e["camera"], e["previous"], e["state"]) for e in lines] == said
    assert {e["level"] for e in lines if e["state"] != "ok"} == {"warning"}
    assert {e["level"] for e in lines if e["state"] == "ok"} == {"info"}
