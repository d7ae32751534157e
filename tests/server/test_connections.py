"""The connection budget on a real ROUTER: counted from its monitor, admitted one at a time
through the accept gate so that the count never passes the cap, silent and quiet peers closed
at the cap, busy ones of a peer over its share, banned peers refused, fds never shut down once
reused, and a monitor that never blocks libzmq however many events pile up."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time

import pytest
import zmq

from stgcnd.server import connections as conn_mod
from stgcnd.server.connections import (
    Connections,
    connection_budget,
    raise_fd_limit,
    split_budget,
)
from stgcnd.server.peers import accepted_peer
from stgcnd.server.receive import _origin
from tests.conftest import REPO


def test_the_budget_keeps_a_reserve_below_the_fd_limit():
    free = 1024 - 60
    usable = free - free // 4
    assert connection_budget(soft_limit=1024, in_use=60, configured=0) == usable * 3 // 4
    assert connection_budget(1024, 60, configured=100) == 100
    assert connection_budget(1024, 60, configured=5000) == usable
    assert connection_budget(1 << 20, 60, configured=0) == conn_mod.CONNECTIONS_AUTO_MAX
    assert connection_budget(70, 60, configured=0) == 1  # nearly nothing free


def test_subscribers_get_an_eighth_of_the_budget_and_cameras_the_rest():
    assert split_budget(569, events=True) == (569 - 71, 71)
    assert split_budget(569, events=False) == (569, 0)
    assert split_budget(1, events=True) == (1, 0)


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
    peers = Peers(ctx, endpoint)
    made: list[Connections] = []

    def make(cap: int, **options: bool) -> Connections:
        c = Connections(ctx, router, cap, **options)
        made.append(c)
        if len(made) == 1:
            router.bind(endpoint)  # after the monitor, as the daemon does
            c.gate_listeners()
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


def request(router: zmq.Socket, conns: Connections, now: float | None = None) -> None:
    """Read one message and tell the connections about it, as the I/O loop does."""
    assert router.poll(5000)
    msg = router.recv_multipart(copy=False)
    fd, peer = _origin(msg[0])
    assert conns.seen(fd, peer, time.monotonic() if now is None else now)


def test_connections_are_counted_and_named_by_process(setup):
    make, peers, _router = setup
    conns = make(cap=10)
    peers.open(3)
    settle(conns, 3)
    assert {c.peer for c in conns.by_fd.values()} == {f"pid:{os.getpid()}"}
    fd = next(iter(conns.by_fd))
    assert accepted_peer(fd) == (f"pid:{os.getpid()}", os.fstat(fd).st_ino)
    peers.socks[0].close(0)
    settle(conns, 2)


def test_at_the_cap_silent_then_quiet_peers_give_way_never_a_talking_one(setup, monkeypatch):
    make, peers, router = setup
    conns = make(cap=3)
    talker = peers.open(1)[0]
    talker.send(b"hello")
    request(router, conns)  # a camera that just sent
    peers.open(5)  # silent peers: each gives way at the cap to the next one waiting
    most = settle_counting(conns, 2)
    assert most <= 3 and conns.closed_idle == 4
    talker.send(b"still here")
    request(router, conns)
    # Silent peers go first whatever their age; a talker quiet for CLOSE_IDLE_S goes next.
    monkeypatch.setattr(conn_mod, "CLOSE_IDLE_S", 0.0)
    conns.cap = 1
    conns.enforce(time.monotonic() + 1)
    settle(conns, 0)
    assert conns.closed_idle == 6


def settle_counting(conns: Connections, want: int, timeout: float = 10.0) -> int:
    """settle(), and the most connections held open at any time on the way."""
    most = len(conns)
    end = time.monotonic() + timeout
    quiet_from = time.monotonic()
    while time.monotonic() < end:
        if conns.monitor.poll(20):
            conns.on_monitor(time.monotonic())
            most = max(most, conns.count)
            quiet_from = time.monotonic()
        elif len(conns) == want and time.monotonic() - quiet_from > 0.3:
            return most
    raise AssertionError(f"{len(conns)} connections, expected {want}")


def test_at_the_cap_busy_connections_of_a_peer_over_its_share_go(setup):
    make, peers, router = setup
    conns = make(cap=100)
    for s in peers.open(6):
        s.send(b"busy")
    settle(conns, 6)
    for _ in range(6):
        request(router, conns)  # every one of them sends
    conns.cap = 6  # one peer holds all six: more than its share with anyone waiting
    conns.enforce(time.monotonic())
    settle(conns, 5)  # none was quiet: one of them made room, busy as it was
    assert conns.closed_idle == 1
    conns.cap = 2
    for _ in range(5):
        conns.enforce(time.monotonic())
    settle(conns, 1)  # never below the share it would have with one more peer waiting
    assert conns.closed_idle == 5


def test_the_gate_holds_a_flood_at_the_cap_and_lets_the_rest_wait_in_the_backlog(tmp_path):
    """Raw connects far faster than the loop reads the monitor: never more than the cap are
    accepted, however long the loop is away; the rest wait in the kernel, and a camera that
    connects behind them gets in once the silent ones gave way."""
    ctx = zmq.Context()
    path = tmp_path / "g.sock"
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.BACKLOG, 1000)
    conns = Connections(ctx, router, cap=20)
    router.bind(f"ipc://{path}")
    conns.gate_listeners()
    raw = []
    try:
        assert conns.gates and conns.gates[0].available, "no accept gate on this system"
        for _ in range(300):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(path))
            raw.append(s)
        time.sleep(0.5)  # the loop is away: libzmq may accept what the gate allowed, no more
        conns.on_monitor(time.monotonic())
        assert conns.count <= 20 + 1, conns.count
        most = conns.count
        camera = ctx.socket(zmq.DEALER)
        camera.setsockopt(zmq.LINGER, 0)
        camera.connect(f"ipc://{path}")
        camera.send(b"hello")
        end = time.monotonic() + 20
        served = False
        while time.monotonic() < end and not served:
            conns.on_monitor(time.monotonic())
            most = max(most, conns.count)
            served = bool(router.poll(1))
        assert served, "the camera waiting behind 300 silent connections never got in"
        assert most <= 20 + 1, most
        assert conns.closed_idle >= 280
        camera.close(0)
    finally:
        for s in raw:
            s.close()
        conns.close()
        router.close(0)
        ctx.term()


def test_a_banned_peer_is_disconnected_and_refused_for_a_while(setup):
    make, peers, router = setup
    conns = make(cap=10)
    bad = peers.open(1)[0]
    bad.send(b"x")
    assert router.poll(5000)
    msg = router.recv_multipart(copy=False)
    fd, peer = _origin(msg[0])
    t0 = time.monotonic()
    conns.ban(fd, peer, t0, reason="test")
    assert not conns.seen(fd, peer, t0)  # its requests are dropped from now on
    conns.enforce(t0 + conn_mod.CLOSE_BANNED_AFTER_S)  # its connection closes shortly after
    settle(conns, 0)
    peers.open(1)
    end = time.monotonic() + 5
    while conns.refused_banned == 0 and time.monotonic() < end:
        if conns.monitor.poll(50):
            conns.on_monitor(time.monotonic())
    assert conns.refused_banned == 1 and len(conns) == 0
    conns.enforce(time.monotonic() + conn_mod.BAN_S + 1)  # the ban ends
    assert conns.seen(-1, peer, time.monotonic() + conn_mod.BAN_S + 1)
    peers.open(1)
    end = time.monotonic() + 5
    while not conns.by_fd and time.monotonic() < end:  # the same process gets in again
        if conns.monitor.poll(50):
            conns.on_monitor(time.monotonic())
    assert conns.by_fd and conns.refused_banned == 1


def test_a_reused_fd_number_is_never_shut_down(setup):
    make, peers, _router = setup
    conns = make(cap=10)
    peers.open(1)
    settle(conns, 1)
    (fd,) = conns.by_fd
    stale_ino = conns.by_fd[fd].ino + 1  # what a closed-and-reused fd looks like
    conns._close(fd, stale_ino)
    settle(conns, 1)  # still connected: the inode did not match
    assert fd in conns.by_fd


def test_memory_pressure_sheds_silent_and_quiet_connections_only(setup, monkeypatch):
    monkeypatch.setattr(conn_mod, "CLOSE_IDLE_S", 0.5)
    make, peers, router = setup
    conns = make(cap=10)
    talker = peers.open(1)[0]
    peers.open(3)
    settle(conns, 4)
    talker.send(b"hello")
    now = time.monotonic() + 1.0
    request(router, conns, now)
    assert conns.shed_quiet(now) == 3
    settle(conns, 1)
    talker.send(b"served")
    assert router.poll(5000)


def test_memory_pressure_spares_a_subscriber_quiet_by_nature(setup):
    """On the events socket (quiet_gives_way=False) a subscriber that subscribed and is quiet
    since stays (its events are bounded, and a cut could abort it: shed_quiet); one that
    never subscribed goes."""
    make, peers, router = setup
    conns = make(cap=10, quiet_gives_way=False)
    subscriber = peers.open(1)[0]
    peers.open(1)
    settle(conns, 2)
    subscriber.send(b"\x01topic")  # its subscription, then nothing
    request(router, conns)
    assert conns.shed_quiet(time.monotonic() + 60.0) == 1  # the one that never subscribed
    settle(conns, 1)
    subscriber.send(b"\x01another")
    assert router.poll(5000)


def test_growth_spares_new_connections_and_those_that_delivered(setup):
    """Growth alone (server/heap.py) cuts only connections that never delivered a request
    and are older than `spare_new_s`: a new camera's first request may still be on its way."""
    make, peers, router = setup
    conns = make(cap=10)
    talker = peers.open(1)[0]
    peers.open(2)
    settle(conns, 3)
    talker.send(b"hello")
    request(router, conns, time.monotonic())
    now = time.monotonic()
    assert conns.shed_quiet(now, None, spare_new_s=60.0) == 0   # all new: nobody goes
    assert conns.shed_quiet(now + 120.0, None, spare_new_s=60.0) == 2  # the silent two
    settle(conns, 1)
    talker.send(b"served")
    assert router.poll(5000)


def test_a_connection_owed_a_reply_is_never_shed_and_one_quiet_is_whatever_it_sent(setup):
    """Growth (server/heap.py) cuts a connection that delivered nothing for `quiet_s`, even
    one that delivered a request before (a huge message after a ping), but never one whose
    request is not answered yet: a camera waiting for its reply would lose it."""
    make, peers, router = setup
    conns = make(cap=10)
    waiting, answered = peers.open(2)
    settle(conns, 2)
    identities = {}
    for name, sock in (("waiting", waiting), ("answered", answered)):
        sock.send(name.encode())
        assert router.poll(5000)
        identity, body = router.recv_multipart(copy=False)
        fd, peer = _origin(identity)
        assert conns.seen(fd, peer, time.monotonic(), identity.bytes)
        identities[body.bytes.decode()] = identity.bytes
    conns.answered(identities["answered"])
    later = time.monotonic() + 1.0
    assert conns.shed_quiet(later, quiet_s=0.1) == 1  # the answered one, quiet since
    assert conns.shed_quiet(later + 60, quiet_s=0.1) == 0  # the waiting one, however long
    settle(conns, 1)
    conns.answered(identities["waiting"])  # its reply went: it may go too
    assert conns.shed_quiet(later, quiet_s=0.1) == 1
    settle(conns, 0)


MONITOR_BACKLOG = """
import socket, sys, time, zmq
sys.path.insert(0, {daemon!r})
from stgcnd.server.connections import Connections
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER)
conns = Connections(ctx, router, 10_000, gate=False)
router.bind("ipc://{path}")
clients = [socket.socket(socket.AF_UNIX) for _ in range(2500)]
for c in clients:
    c.connect("{path}")
time.sleep(1.0)  # the monitor is not read: libzmq must not block on it
probe = ctx.socket(zmq.DEALER)
probe.connect("ipc://{path}")
probe.send(b"still served")
print("served" if router.poll(5000) else "stuck", flush=True)
conns.close()  # must not hang on the unread events
print("closed", flush=True)
"""


def test_an_unread_monitor_never_blocks_libzmq(tmp_path):
    raise_own = resource.getrlimit(resource.RLIMIT_NOFILE)
    if raise_own[1] != resource.RLIM_INFINITY and raise_own[1] < 6000:
        pytest.skip("needs 6,000 fds for the client sockets")
    code = MONITOR_BACKLOG.format(daemon=str(REPO / "daemon"), path=tmp_path / "m.sock")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, preexec_fn=lambda: resource.setrlimit(
                             resource.RLIMIT_NOFILE, (6000, raise_own[1])))
    assert out.stdout.split() == ["served", "closed"], out.stdout + out.stderr
