"""Issue #34, the subscriber side: against a real `stgcnd serve`, every message on the events
endpoint is numbered within the daemon's run, heartbeats come every `events_heartbeat_s`, a
late subscriber is told the events already open (a snapshot), and `Events` raises once the
daemon is gone instead of waiting for ever. Every daemon is stopped by pid."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
import zmq

from stgcnd.server.event_publisher import HEARTBEAT_TOPIC
from stgcnd_client import Client, Events, NoHeartbeat
from tests.server.daemon_harness import Daemon, stop_by_pid
from tests.server.test_events import EVENTS_MODEL

WINDOW = np.zeros((3, 30, 33, 1), np.float32)
HEARTBEAT_S = 0.3


@pytest.fixture
def daemon(tmp_path):
    endpoint = f"ipc://{tmp_path / 'events.sock'}"
    # feed_intervals: cam1's feed, idle seconds after its one window, would be said silent on
    # its topic (#34 feed health), which these tests of the numbering do not read.
    d = Daemon(tmp_path, models=EVENTS_MODEL.format(exit=0.4), events_endpoint=endpoint,
               events_heartbeat_s=HEARTBEAT_S, feed_intervals=1000)
    d.start()
    yield d, endpoint
    stop_by_pid(d)


class RawSub:
    """A plain SUB of the given topics, as a subscriber in another language would be."""

    def __init__(self, endpoint: str, *topics: bytes) -> None:
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        for topic in topics:
            self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)

    def read(self, seconds: float, most: int = 1 << 20) -> list[tuple[bytes, dict]]:
        """The messages within `seconds`, at most `most`."""
        out: list[tuple[bytes, dict]] = []
        end = time.monotonic() + seconds
        while len(out) < most and self.sock.poll(max(int((end - time.monotonic()) * 1e3), 0)):
            topic, body = self.sock.recv_multipart()
            out.append((topic, msgpack.unpackb(body, raw=False)))
        return out

    def close(self) -> None:
        self.sock.close(0)


def heard_heartbeat(events: Events) -> dict:
    """The heartbeat that answers `events`' subscription: the daemon has it."""
    message = events.recv(timeout_ms=10_000)
    assert message is not None and message["kind"] == "heartbeat", message
    return message


def test_every_message_is_numbered_and_heartbeats_arrive(daemon):
    d, endpoint = daemon
    sub = RawSub(endpoint, b"")
    try:
        first = sub.read(5.0, most=1)   # the subscription's answer: a heartbeat (nothing open)
        assert first and first[0][0] == HEARTBEAT_TOPIC, first
        with Client(d.endpoint, camera_id="cam1") as cam:
            cam.infer(WINDOW)        # the noop model's 0.5 starts an event at once
        got = first + sub.read(6 * HEARTBEAT_S)
    finally:
        sub.close()
    seqs = [m["seq"] for _, m in got]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs   # no gap, no repeat
    assert len({m["run"] for _, m in got}) == 1
    beats = [m for topic, m in got if topic == HEARTBEAT_TOPIC]
    assert all(m["kind"] == "heartbeat" and m["interval_s"] == HEARTBEAT_S for m in beats)
    assert len(beats) >= 4, beats                   # one at once, then one every 0.3 s
    assert beats[-1]["open"] == 1                   # cam1's event
    starts = [m for topic, m in got if topic == b"cam1"]
    assert [m["kind"] for m in starts] == ["start"]
    logged = [e for e in d.log_events() if e.get("event") == "action_event"]
    assert [(e["seq"], e["run"]) for e in logged] == [(starts[0]["seq"], starts[0]["run"])]


def test_a_late_subscriber_is_told_the_event_already_open(daemon):
    d, endpoint = daemon
    with Events(endpoint, heartbeats=True) as early:
        heard_heartbeat(early)
        with Client(d.endpoint, camera_id="cam1") as cam:
            cam.infer(WINDOW)
        start = early.recv(timeout_ms=5000)
        while start is not None and start["kind"] == "heartbeat":  # one may come first
            start = early.recv(timeout_ms=5000)
        assert start is not None and start["kind"] == "start"
    by_topic = RawSub(endpoint, b"cam1")          # a camera's topic alone
    beats_only = RawSub(endpoint, HEARTBEAT_TOPIC)
    try:
        with Events(endpoint, cameras=["cam1"]) as late:
            snapshot = late.recv(timeout_ms=5000)
            assert snapshot is not None and snapshot["kind"] == "snapshot"
            assert snapshot["id"] == start["id"] and snapshot["started"] == start["started"]
            assert snapshot["seq"] > start["seq"] and snapshot["run"] == start["run"]
            assert late.recv(timeout_ms=500) is None   # told once, however many snapshots
            topics = {t: m["kind"] for t, m in by_topic.read(1.0)}
            assert topics == {b"cam1": "snapshot"}   # no heartbeat on a camera's topic
            # subscribed with by_topic: a heartbeat has waited there during its second
            assert {t for t, _ in beats_only.read(1.0, most=1)} == {HEARTBEAT_TOPIC}
            d.signal(15)
            end = late.recv(timeout_ms=10_000)
            assert end is not None and (end["kind"], end["id"]) == ("end", start["id"])
    finally:
        by_topic.close()
        beats_only.close()


@pytest.mark.timeout(120)  # before #34, iterating waited for ever
def test_iterating_ends_once_the_daemon_is_gone(daemon):
    d, endpoint = daemon
    with Events(endpoint) as events:
        with Client(d.endpoint, camera_id="cam1") as cam:
            cam.infer(WINDOW)
        got = []
        with pytest.raises(NoHeartbeat):
            for event in events:
                got.append(event["kind"])
                d.proc.kill()   # no shutdown: no end, no more heartbeats
                gone = time.monotonic()
        waited = time.monotonic() - gone
    assert got == ["start"]
    assert waited < 3 * HEARTBEAT_S + 2.0, waited
