"""The connection budget on a real ROUTER: counted from its monitor, idle peers closed above
the cap, the listener paused at the brake and resumed below the cap, banned peers refused."""

from __future__ import annotations

import os
import resource
import time

import pytest
import zmq

from stgcnd.server import connections as conn_mod
from stgcnd.server.connections import Connections, connection_budget, peer_of, raise_fd_limit


def test_the_budget_keeps_a_reserve_below_the_fd_limit():
    free = 1024 - 60
    usable = free - free // 4
    assert connection_budget(soft_limit=1024, in_use=60, configured=0) == usable * 3 // 4
    assert connection_budget(1024, 60, configured=100) == 100
    assert connection_budget(1024, 60, configured=5000) == usable  # never into the reserve
    assert connection_budget(1 << 20, 60, configured=0) == conn_mod.CONNECTIONS_AUTO_MAX
    assert connection_budget(70, 60, configured=0) == 1  # nearly nothing free


def test_the_soft_fd_limit_is_raised_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        before, now, hard_seen = raise_fd_limit(ceiling=4096)
        assert (before, hard_seen) == (min(256, hard), hard)
        assert now == min(hard, 4096)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == now
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Peers:
    """DEALERs that do not reconnect once the daemon closes them."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.ctx, self.endpoint, self.socks = ctx, endpoint, []

    def open(self, n: int) -> list[zmq.Socket]:
        new = []
        for _ in range(n):
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.RECONNECT_IVL, -1)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(self.endpoint)
            new.append(s)
        self.socks += new
        return new

    def close(self) -> None:
        for s in self.socks:
            s.close(0)


@pytest.fixture
def setup(tmp_path):
    ctx = zmq.Context()
    endpoint = f"ipc://{tmp_path / 'c.sock'}"
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    peers = Peers(ctx, endpoint)
    made: list[Connections] = []

    def make(cap: int) -> Connections:
        c = Connections(router, cap)
        made.append(c)
        return c

    yield make, peers, router
    for c in made:
        c.close()
    peers.close()
    router.close(0)
    ctx.term()


def settle(conns: Connections, want: int, timeout: float = 5.0) -> None:
    """Process monitor events until `want` connections and nothing more for 0.3 s."""
    end = time.monotonic() + timeout
    quiet_from = time.monotonic()
    while time.monotonic() < end:
        if conns.monitor.poll(20):
            conns.on_monitor(time.monotonic())
            quiet_from = time.monotonic()
        elif len(conns) == want and time.monotonic() - quiet_from > 0.3:
            return
    raise AssertionError(f"{len(conns)} connections, expected {want}")


def test_connections_are_counted_and_named_by_process(setup):
    make, peers, _router = setup
    conns = make(cap=10)
    peers.open(3)
    settle(conns, 3)
    assert {c.peer for c in conns.by_fd.values()} == {f"pid:{os.getpid()}"}
    assert peer_of(next(iter(conns.by_fd))) == f"pid:{os.getpid()}"
    peers.socks[0].close(0)
    settle(conns, 2)


def test_above_the_cap_silent_then_quiet_peers_are_closed_never_a_talking_one(setup,
                                                                               monkeypatch):
    make, peers, router = setup
    conns = make(cap=3)
    talker = peers.open(1)[0]
    talker.send(b"hello")
    assert router.poll(5000)
    msg = router.recv_multipart(copy=False)
    conns.seen(msg[0].get(zmq.SRCFD), time.monotonic())  # a camera that just sent
    peers.open(5)  # silent peers: closed above the cap whatever their age
    settle(conns, 3)
    assert conns.closed_idle == 3
    talker.send(b"still here")
    assert router.poll(5000), "the talking peer was closed instead of a silent one"
    router.recv_multipart()
    # Silent peers go first whatever their age; a talker quiet for CLOSE_IDLE_S goes next.
    monkeypatch.setattr(conn_mod, "CLOSE_IDLE_S", 0.0)
    conns.cap = 1
    conns.enforce(time.monotonic() + 1)
    settle(conns, 1)
    assert conns.closed_idle == 5 and [c.last_request > 0 for c in conns.by_fd.values()] == [
        True]
    talker.send(b"and now?")
    assert router.poll(5000)


def test_a_banned_peer_is_disconnected_and_refused_for_a_while(setup):
    make, peers, _router = setup
    conns = make(cap=10)
    bad = peers.open(1)[0]
    settle(conns, 1)
    (fd,) = conns.by_fd
    conns.ban(fd, f"pid:{os.getpid()}", time.monotonic(), reason="test")
    settle(conns, 0)
    peers.open(1)
    end = time.monotonic() + 5
    while conns.refused_banned == 0 and time.monotonic() < end:
        if conns.monitor.poll(50):
            conns.on_monitor(time.monotonic())
    assert conns.refused_banned == 1 and len(conns) == 0
    # The ban ends: the same process connects again.
    conns.on_monitor(time.monotonic() + conn_mod.BAN_S + 1)
    peers.open(1)
    settle(conns, 1)
    del bad


def test_memory_pressure_sheds_the_quiet_connections_only(setup, monkeypatch):
    monkeypatch.setattr(conn_mod, "CLOSE_IDLE_S", 0.5)
    make, peers, router = setup
    conns = make(cap=10)
    talker = peers.open(1)[0]
    peers.open(3)
    settle(conns, 4)
    talker.send(b"hello")
    assert router.poll(5000)
    msg = router.recv_multipart(copy=False)
    now = time.monotonic() + 1.0
    conns.seen(msg[0].get(zmq.SRCFD), now)
    assert conns.shed_quiet(now) == 3
    settle(conns, 1)
    talker.send(b"served")
    assert router.poll(5000)
