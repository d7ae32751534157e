"""Refused handshakes are logged with who and why (issue #32, item 7): a camera without CURVE
keys, or with the wrong server key, gets no reply at all, so the daemon's log is the only
place that can say what went wrong. Real ROUTER and DEALER sockets over the loopback; the
ROUTER's monitor is read by Connections as the daemon reads it."""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Iterator

import pytest
import zmq
from structlog.testing import capture_logs

from stgcnd.server import handshakes
from stgcnd.server.connections import Connections
from stgcnd.server.handshakes import (
    Refusals,
    hang_up_refusal,
    monitor_reporter,
    protocol_refusal,
)
from tests.curve_router import curve_server_router

PROTOCOL = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
HUNG_UP = int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


@pytest.fixture
def curve_router() -> Iterator[tuple[zmq.Context, str, bytes, Connections]]:
    """A CURVE-server ROUTER on the loopback, watched by Connections like the daemon's."""
    ctx = zmq.Context()
    router, public = curve_server_router(ctx)
    conns = Connections(ctx, router, cap=16)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    conns.gate_listeners()
    yield ctx, f"tcp://127.0.0.1:{port}", public, conns
    conns.close()
    router.close(0)
    ctx.term()


def dealer(ctx: zmq.Context, endpoint: str, server_key: bytes | None = None) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    if server_key is not None:
        public, secret = zmq.curve_keypair()
        s.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        s.setsockopt(zmq.CURVE_PUBLICKEY, public)
        s.setsockopt(zmq.CURVE_SECRETKEY, secret)
    s.connect(endpoint)
    return s


def failures(conns: Connections, want: int, timeout: float = 5.0
             ) -> list[tuple[int, int, str]]:
    """The first `want` failed handshakes: (monitor event, its value, peer)."""
    got: list[tuple[int, int, str]] = []
    conns.on_handshake_failed = lambda event, value, peer: got.append((event, value, peer))
    end = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < end:
        if conns.monitor.poll(20):
            conns.on_monitor(time.monotonic())
    return got


def test_a_client_without_keys_is_reported(curve_router):
    ctx, endpoint, _, conns = curve_router
    got = []
    for _ in range(4):
        s = dealer(ctx, endpoint)
        try:
            got += failures(conns, 1)
        finally:
            s.close(0)
    assert len(got) == 4
    for event, value, peer in got:
        # The mismatch, or the client hanging up on finding it first (handshakes.py).
        refusal = (protocol_refusal(value, curve=True) if event == PROTOCOL
                   else hang_up_refusal(value, curve=True))
        assert refusal.reason in ("no-keys", "hung-up"), refusal
        assert "stgcnd keys create" in refusal.action
        # On the loopback the refusal can beat the loop to the accept: then who is unknown.
        assert peer == "unknown" or peer.startswith(("pid:", "uid:", "ip:", "fd:")), peer


def test_the_peer_is_named_when_its_connection_was_seen_first(curve_router):
    """A remote client's greeting takes a network round trip: the loop has seen its accept
    by then. A raw socket that waits before its greeting stands in for one."""
    _, endpoint, _, conns = curve_router
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port))) as raw:
        end = time.monotonic() + 5
        while not conns.by_fd and time.monotonic() < end:
            if conns.monitor.poll(20):
                conns.on_monitor(time.monotonic())
        (seen,) = [c.peer for c in conns.by_fd.values()]
        raw.sendall(b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0")
                    + bytes(32))  # a ZMTP 3 greeting without CURVE: what a keyless client says
        ((event, error, peer),) = failures(conns, 1)
    assert (event, error) == (PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    assert peer == seen and peer != "unknown"


def test_a_wrong_server_key_is_reported_as_such(curve_router):
    ctx, endpoint, _, conns = curve_router
    s = dealer(ctx, endpoint, server_key=zmq.curve_keypair()[0])  # not this router's key
    try:
        (event, error, _peer), *_ = failures(conns, 1)
    finally:
        s.close(0)
    assert event == PROTOCOL  # the client waits for the daemon's answer: no race here
    assert protocol_refusal(error, curve=True).reason == "wrong-server-key"


def test_the_right_key_is_not_a_failure(curve_router):
    ctx, endpoint, public, conns = curve_router
    s = dealer(ctx, endpoint, server_key=public)
    try:
        assert failures(conns, 1, timeout=1.0) == []
        assert len(conns) == 1
    finally:
        s.close(0)


def test_refusals_are_logged_once_per_reason_per_window_with_a_count(monkeypatch):
    refusals = Refusals("curve_denied", "denied")
    report = monitor_reporter(refusals, curve=True)
    no_keys = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    with capture_logs() as logs:
        for _ in range(5):
            report(PROTOCOL, no_keys, "ip:10.0.0.7")
        report(PROTOCOL, int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC), "ip:10.0.0.8")
        report(HUNG_UP, errno.EPIPE, "unknown")
        monkeypatch.setattr(handshakes, "LOG_EVERY_S", 0.0)  # the window has passed
        refusals._next_line = dict.fromkeys(refusals._next_line, 0.0)
        report(PROTOCOL, no_keys, "ip:10.0.0.7")
    assert refusals.count == 8
    lines = [(e["reason"], e["denied"], e["peer"], e.get("address")) for e in logs]
    assert lines == [("no-keys", 1, "ip:10.0.0.7", "10.0.0.7"),
                     ("wrong-server-key", 1, "ip:10.0.0.8", "10.0.0.8"),
                     ("hung-up", 1, "unknown", None),
                     ("no-keys", 5, "ip:10.0.0.7", "10.0.0.7")]  # the 4 held back, and this
    assert "EPIPE" in logs[2]["why"]
    assert all(e["event"] == "curve_denied" and e["log_level"] == "warning" for e in logs)


def test_without_curve_a_client_with_keys_is_told_curve_is_off():
    refusal = protocol_refusal(int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH), curve=False)
    assert refusal.reason == "curve-off" and 'curve = "on"' in refusal.action
    assert 'curve = "on"' in hang_up_refusal(errno.EPIPE, curve=False).action
    other = protocol_refusal(int(zmq.PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND), curve=False)
    assert other.reason == "protocol-error" and "ZMTP_UNEXPECTED_COMMAND" in other.why
