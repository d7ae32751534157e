"""Hardening III (issue #36, items 1 and 3): the events socket under the same guard as the
requests one, against a real `stgcnd serve`: a subscription longer than any camera id costs
the daemon nothing, a subscriber holding too many subscriptions is cut off and its peer
banned, and a never-ending message is cut by the memory limit. A well-behaved subscriber
keeps getting events throughout. Every daemon is stopped by pid."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from stgcnd.server.event_publisher import MAX_SUBSCRIPTIONS
from stgcnd_client import Client
from stgcnd_client import Events as Subscriber
from tests.conftest import REPO
from tests.server.daemon_harness import Daemon, process_stats, stop_by_pid
from tests.server.raw_zmtp import connect, frame
from tests.server.test_events import EVENTS_MODEL
from tests.server.test_hardening import log_text

pytestmark = pytest.mark.slow

WINDOW = np.zeros((3, 30, 33, 1), np.float32)


@pytest.fixture
def publisher(tmp_path):
    made: list[Daemon] = []

    def start(**server: object) -> tuple[Daemon, str]:
        events = f"ipc://{tmp_path / 'events.sock'}"
        d = Daemon(tmp_path, models=EVENTS_MODEL.format(exit=0.4), events_endpoint=events,
                   **server)
        made.append(d.start())
        return d, events

    yield start
    for d in made:
        stop_by_pid(d, term_timeout=15.0)


def hears_an_event(d: Daemon, events: Subscriber, prefix: str) -> bool:
    """Throwaway cameras (the noop model starts an event for each) until `events` hears one."""
    for i in range(40):
        with Client(d.endpoint, camera_id=f"{prefix}{i}") as cam:
            cam.infer(WINDOW)
        if events.recv(timeout_ms=200) is not None:
            return True
    return False


def test_a_ten_megabyte_subscription_costs_the_daemon_nothing(publisher):
    d, endpoint = publisher()
    with Subscriber(endpoint) as good:
        assert hears_an_event(d, good, "warm")
        before = process_stats(d.proc.pid)["rss_kb"]
        # A raw ZMTP subscriber: libzmq's own SUB keeps a topic as one trie node per byte,
        # and some versions overflow their stack on a 10 MB one before it is even sent.
        end = time.monotonic() + 3.0
        tries = 0
        while time.monotonic() < end:  # as a SUB would: reconnect and subscribe again
            sock = connect(endpoint, b"SUB")  # the handshake must succeed
            tries += 1
            try:
                sock.sendall(frame(b"\x01" + b"c" * (10 << 20), more=False))
                time.sleep(0.5)
            except OSError:
                time.sleep(0.1)  # dropped while sending: what the limit is for
            finally:
                sock.close()
        assert tries
        assert hears_an_event(d, good, "after")  # a publisher applies subscriptions now
        during = process_stats(d.proc.pid)["rss_kb"]
    grew_mb = (during - before) / 1024
    print(f"\nRSS {before / 1024:.1f} MB -> {during / 1024:.1f} MB with a 10 MB subscription")
    assert grew_mb < 50, f"a 10 MB subscription cost {grew_mb:.0f} MB"
    assert d.proc.poll() is None


def test_a_subscriber_over_the_subscription_limit_is_cut_off_and_banned(publisher):
    d, endpoint = publisher()
    ctx = zmq.Context()
    greedy = ctx.socket(zmq.SUB)
    greedy.setsockopt(zmq.LINGER, 0)
    greedy.setsockopt(zmq.SNDHWM, 0)  # else the SUB itself stops at 1,000 subscriptions
    greedy.connect(endpoint)
    for i in range(MAX_SUBSCRIPTIONS + 100):
        greedy.setsockopt(zmq.SUBSCRIBE, f"topic-{i}".encode())
    end = time.monotonic() + 15
    refused = 0
    with Client(d.endpoint, camera_id="probe") as c:
        while time.monotonic() < end and not refused:
            refused = c.stats()["events_connections"]["subscribers_refused"]
            time.sleep(0.2)
    greedy.close(0)
    ctx.term()
    assert refused >= 1
    banned = [e for e in d.log_events() if e["event"] == "peer_banned"]
    assert banned and banned[0]["socket"] == "events", banned


@pytest.mark.timeout(240)
def test_an_endless_message_to_the_events_socket_is_cut_off(publisher):
    """The events socket's connections are shed under memory pressure like the requests
    socket's (the issue measured 1,556 MB before; the requests socket cut it at ~640 MB)."""
    d, endpoint = publisher(max_rss_mb=300)
    script = REPO / "tests" / "server" / "raw_zmtp.py"
    attack = subprocess.Popen([sys.executable, str(script), endpoint, "8", "SUB", "1000"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert attack.stdout.readline().strip() == "sending"
        out = attack.communicate(timeout=60)[0].strip()
    finally:
        if attack.poll() is None:
            attack.kill()
            attack.wait()
    time.sleep(1.5)
    assert d.proc.poll() is None, "the daemon died:\n" + log_text(d)[-2000:]
    status = Path(f"/proc/{d.proc.pid}/status").read_text()
    peak_kb = int(status.split("VmHWM:")[1].split()[0])
    print(f"\n{out}; daemon RSS peak {peak_kb / 1024:.0f} MB")
    assert out.startswith("closed after"), out
    assert '"event": "memory_pressure"' in log_text(d)
    assert peak_kb < 700 * 1024
    with Subscriber(endpoint) as good:
        assert hears_an_event(d, good, "after")


CHURN = REPO / "scripts" / "snapshot_churn.py"


def _attack(kind: str, endpoint: str) -> subprocess.Popen:
    """An attacker process (its own peer on ipc), from the figure's script."""
    return subprocess.Popen([sys.executable, str(CHURN), "--attacker", kind, endpoint,
                             "--toggle-ms", "10"])


def test_subscription_churn_costs_a_legitimate_subscriber_at_most_twice_its_quiet_traffic(
        publisher):
    """Hardening IV (#41, item 5): one subscriber toggling its subscription and one process
    reconnecting with a new subscription each time. A snapshot goes to every subscriber of
    its topics, so each caused one to a legitimate subscriber of "": the issue measured x13,
    and this test x24 before. Now a subscriber's first ask (of a peer's first 8) is answered at
    once and every other ask waits: all of them together get one snapshot an interval (10 s).
    The legitimate subscriber gets its own snapshot at once, and at most one more."""
    d, endpoint = publisher()
    opened = 8
    for i in range(opened):
        with Client(d.endpoint, camera_id=f"open{i}") as cam:
            cam.infer(WINDOW)
    attackers = [_attack("toggle", endpoint), _attack("reconnect", endpoint)]
    try:
        with Client(d.endpoint, camera_id="probe") as probe:  # the attackers' free asks spent
            end = time.monotonic() + 10
            while time.monotonic() < end and probe.stats()["events_connections"].get(
                    "snapshots_deferred", 99) < 20:
                time.sleep(0.1)
        time.sleep(0.5)
        ctx = zmq.Context()
        legit = ctx.socket(zmq.SUB)
        legit.setsockopt(zmq.LINGER, 0)
        legit.connect(endpoint)
        legit.setsockopt(zmq.SUBSCRIBE, b"")
        snapshots, first = 0, None
        start = time.monotonic()
        end = start + 5.0
        while time.monotonic() < end:
            if legit.poll(100):
                _, body = legit.recv_multipart()
                if msgpack.unpackb(body)["kind"] == "snapshot":
                    snapshots += 1
                    first = first or time.monotonic() - start
        legit.close(0)
        ctx.term()
    finally:
        for proc in attackers:
            proc.kill()
            proc.wait()
    print(f"\nlegitimate subscriber: {snapshots} snapshot messages in 5 s, {opened} open, "
          f"first after {first} s")
    assert first is not None and first < 2.0   # a late subscriber is answered at once
    assert opened <= snapshots <= 2 * opened
    assert d.proc.poll() is None


def test_one_shot_topics_over_many_connections_get_the_peer_banned(publisher):
    """#41, item 5: a process subscribing and unsubscribing one-shot topics, a new connection
    every 1,000, never reached one connection's limit (8,192 in its life) and was never
    banned; now a peer's (un)subscriptions over all its connections are counted too."""
    d, endpoint = publisher()
    attacker = _attack("rotate", endpoint)
    try:
        end = time.monotonic() + 20
        banned: list[dict] = []
        while time.monotonic() < end and not banned:
            time.sleep(0.5)
            banned = [e for e in d.log_events() if e["event"] == "peer_banned"]
    finally:
        attacker.kill()
        attacker.wait()
    assert banned and banned[0]["socket"] == "events", banned
    assert banned[0]["peer"] == f"pid:{attacker.pid}"
    with Subscriber(endpoint) as good:
        assert hears_an_event(d, good, "after")
