"""Who is connected, and how many: each listening socket's connections, counted from its
monitor against its share of the file-descriptor budget, and closed to make room."""

from __future__ import annotations

import ctypes
import fcntl
import heapq
import itertools
import os
import resource
import struct
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import zmq

from stgcnd.log import get_logger
from stgcnd.server.accept_gate import AcceptGate
from stgcnd.server.peers import accepted_peer

log = get_logger(__name__)

FD_LIMIT_CEILING = 65536   # raise the soft limit this far at most (large fd tables cost)
FD_RESERVE_MIN = 64        # fds kept for what the daemon opens after READY (reloads, logs)
CONNECTIONS_AUTO_MAX = 4096
EVENTS_SHARE = 8           # the events socket's subscribers get 1/8 of the connection cap
CLOSE_IDLE_S = 1.0         # a connection quiet this long may be closed above the cap
BAN_S = 10.0               # a peer that broke the frame limit is refused this long
CLOSE_BANNED_AFTER_S = 0.2  # the banned connection's last reply (too-large) leaves first
LOG_EVERY_S = 60.0         # the connections_limited line, at most once a minute
ROOM_DIVISOR = 16          # at the cap, 1/16 of it is closed to let waiting peers in
GATE_FIND_S = 2.0          # how long libzmq's I/O thread may take to register a listener
GATE_WAIT_S = 0.1          # ... of which the bind waits this long before serving
CLOSING_FORGET_S = 5.0     # a shut-down fd whose disconnect event never came stops counting
_SHUT_RDWR = 2

_ACCEPTED = int(zmq.EVENT_ACCEPTED)
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
_LISTENING = int(zmq.EVENT_LISTENING)
_ACCEPT_FAILED = int(zmq.EVENT_ACCEPT_FAILED)
# A handshake that failed: on a ZMTP error (its value), or as the peer hung up (an errno)
_HANDSHAKE_FAILED = (int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL),
                     int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL))
_EVENT = struct.Struct("=HI")     # a monitor message's first frame: event id, value (the fd)
_INT = struct.Struct("i")
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
_unique = itertools.count()


def raise_fd_limit(ceiling: int = FD_LIMIT_CEILING) -> tuple[int, int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most `ceiling`).

    Returns (soft before, soft now, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard if hard != resource.RLIM_INFINITY else ceiling, ceiling)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    else:
        target = soft
    return soft, target, hard


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: assume little is open
        return 32


def connection_budget(soft_limit: int, in_use: int, configured: int) -> int:
    """The most connections the daemon's listeners may hold together, from the fd limit and
    the fds open now: of the free fds, a quarter (at least FD_RESERVE_MIN) stays for what the
    daemon itself opens later (reloads, logs); the cap takes three quarters of the rest (or
    what is configured, up to all of it). The accept gate (server/accept_gate.py) holds the
    count to it exactly, so what is left below the fd limit is spare."""
    free = max(soft_limit - in_use, 0)
    usable = max(free - max(free // 4, FD_RESERVE_MIN), 1)
    cap = min(configured, usable) if configured else min(usable * 3 // 4, CONNECTIONS_AUTO_MAX)
    return max(cap, 1)


def split_budget(cap: int, events: bool) -> tuple[int, int]:
    """(requests, events) shares of the connection cap: subscribers get an eighth (at least
    one), cameras the rest; no events socket, cameras get all of it."""
    if not events or cap < 2:
        return cap, 0
    subscribers = max(cap // EVENTS_SHARE, 1)
    return cap - subscribers, subscribers


def connection_caps(configured: int, events: bool) -> tuple[int, int]:
    """The connection caps, (requests, events), from the fd limit raised and the fds open."""
    before, soft, hard = raise_fd_limit()
    in_use = open_fds()
    cap = connection_budget(soft, in_use, configured)
    requests_cap, events_cap = split_budget(cap, events)
    log.info("fd_limit", soft_before=before, soft=soft, hard=hard, open=in_use,
             max_connections=cap, requests=requests_cap, events=events_cap)
    return requests_cap, events_cap


def _unread(conn: Connection) -> int:
    """Bytes the kernel holds that `conn`'s peer sent and libzmq has not read yet (FIONREAD;
    0 when the fd is no longer that connection)."""
    try:
        if os.fstat(conn.fd).st_ino != conn.ino:
            return 0
        return int(_INT.unpack(fcntl.ioctl(conn.fd, termios.FIONREAD, bytes(4)))[0])
    except OSError:
        return 0


def _still_sending(conn: Connection, now: float) -> bool:
    """`conn` has unread bytes now and had at an earlier check, delivering nothing since."""
    if _unread(conn) <= 0:
        conn.sending_at = 0.0
        return False
    if conn.last_request < conn.sending_at < now:
        return True
    conn.sending_at = now
    return False


def _libc_shutdown() -> Callable[[int, int], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).shutdown
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


@dataclass
class Connection:
    fd: int
    ino: int                     # the socket's inode: the fd number may be reused
    peer: str
    since: float                 # monotonic: accepted
    last_request: float = 0.0    # monotonic: its last request; 0 = none yet
    owed: int = 0                # its requests not answered yet: never shed while it waits
    sending_at: float = 0.0      # monotonic: a growth check that found it sending, quiet
    identity: bytes = b""        # its ROUTER routing id, which its replies are sent to

    def quiet_since(self) -> float:
        return max(self.since, self.last_request)


# ZeroMQ accepts connections in its own I/O thread, one file descriptor each, and when none is
# left libzmq 4.3 aborts the process on an ipc listener (`Too many open files
# (src/ipc_listener.cpp)`) or spins on a tcp one. So each listening socket (the requests
# ROUTER, the events XPUB) has a Connections: its monitor reports each accept and disconnect
# (with the fd), and its accept gate (server/accept_gate.py) lets libzmq accept only while the
# socket is under its share of the budget: the count never passes the cap, whatever the rate
# of connects, and what waits stays in the kernel's backlog.
#
# - at start, the soft fd limit is raised to the hard one (systemd's default soft limit is 1024);
# - at the cap the loop makes room: first connections that never sent anything (oldest first),
#   then those quiet for CLOSE_IDLE_S, else the least recently active of a peer holding more
#   than its share, busy or not: no peer keeps the others out;
# - a peer whose message broke a limit is refused for BAN_S and its connection closed.
#
# A connection is closed with shutdown(2) on its fd, after checking that the fd is still the
# socket that was accepted (its inode): libzmq owns the fd, sees the hang-up and closes it
# itself; the descriptor is never closed behind its back, and it counts until the monitor's
# disconnect event says it is gone. The monitor's socket takes events without a bound:
# libzmq's I/O thread blocks on a full monitor pipe (socket_base.cpp).
class Connections:
    """One socket's connections, counted from its monitor and admitted through its accept
    gate; see the comment above it. Made before the socket binds, so that no connection is
    accepted unseen.

    `quiet_gives_way`: at the cap, connections quiet for CLOSE_IDLE_S make room (cameras
    send all the time, so a quiet one reconnects when it next needs to); False for the
    events socket, whose subscribers are quiet by nature and only never-subscribed ones give
    way. `gate`: False only for tests of the monitor itself."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], sock: zmq.Socket[bytes],
                 cap: int, name: str = "requests", quiet_gives_way: bool = True,
                 gate: bool = True) -> None:
        self.sock = sock
        self.cap = cap
        self.name = name
        self.quiet_gives_way = quiet_gives_way
        self.by_fd: dict[int, Connection] = {}
        self._by_identity: dict[bytes, Connection] = {}  # those that delivered a request
        # fd -> peer key of a loopback tcp connection, its process or user (peers.peer_key)
        self.loopback: dict[int, str] = {}
        address = f"inproc://stgcnd-monitor-{next(_unique)}"
        sock.monitor(address, _ACCEPTED | _DISCONNECTED | _LISTENING | _ACCEPT_FAILED
                     | _HANDSHAKE_FAILED[0] | _HANDSHAKE_FAILED[1])
        self.monitor = ctx.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.RCVHWM, 0)  # never full: libzmq would block its I/O thread
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.connect(address)
        self.gates: list[AcceptGate] = []
        self._use_gate = gate
        self._listeners: list[tuple[int, float]] = []  # (fd, give up at): not gated yet
        # Shut down, and not yet closed by libzmq: their fds still count.
        self._closing: dict[int, float] = {}
        self.closed_idle = 0        # connections closed at the cap, ever
        self.refused_banned = 0     # connections of banned peers closed on sight, ever
        self.shed = 0               # connections closed under memory pressure, ever
        self.accepted = 0           # connections accepted, ever (server/heap.py's growth)
        self._banned: dict[str, float] = {}   # peer -> monotonic time the ban ends
        self._close_later: list[tuple[float, int, int]] = []  # (when, fd, inode)
        self._shutdown = _libc_shutdown()
        self._logged_at = 0.0
        self._logged_counts = (0, 0)
        # A failed handshake, told (monitor event, its value, peer) once its connection is
        # known; set by the server (server/handshakes.py). The monitor's HANDSHAKE_FAILED_*
        # events carry no fd: libzmq's I/O thread sends that connection's DISCONNECTED, with
        # the fd, right after one (one I/O thread: nothing comes between), so it waits here.
        self.on_handshake_failed: Callable[[int, int, str], None] | None = None
        self._failed_handshake: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.by_fd)

    @property
    def count(self) -> int:
        """Descriptors this socket's connections hold: open ones and those shut down that
        libzmq has not closed yet."""
        return len(self.by_fd) + len(self._closing)

    # -- what the I/O loop calls -----------------------------------------------------------
    def on_monitor(self, now: float) -> None:
        """Take the monitor's pending events, then keep the count inside the budget."""
        self._take_events(now)
        self.enforce(now)

    def _take_events(self, now: float) -> None:
        monitor = self.monitor
        # cast: pyzmq types every option's value `int | bytes`; ZMQ_EVENTS is an int.
        while cast(int, monitor.get(_EVENTS)) & _POLLIN:
            head = monitor.recv(_NOBLOCK)
            monitor.recv(_NOBLOCK)  # the endpoint frame
            event, value = _EVENT.unpack_from(head)
            failed, self._failed_handshake = self._failed_handshake, None
            if event in _HANDSHAKE_FAILED:
                self._failed_handshake = (event, value)
            elif event == _ACCEPTED:
                self._accepted(value, now)
                for gate in self.gates:
                    gate.consumed()
            elif event == _DISCONNECTED:
                conn = self.by_fd.pop(value, None)
                self._forget(conn)
                if failed is not None and self.on_handshake_failed is not None:
                    # No conn: it closed before its accept was read (a local client is
                    # refused within microseconds), so who it was is lost.
                    self.on_handshake_failed(*failed, conn.peer if conn else "unknown")
                self._closing.pop(value, None)
                self.loopback.pop(value, None)
            elif event == _ACCEPT_FAILED:  # value: errno; the arming is spent all the same
                for gate in self.gates:
                    gate.consumed()
            elif event == _LISTENING and self._use_gate:
                self._listeners.append((value, now + GATE_FIND_S))
        self._arm()

    def _arm(self) -> None:
        """One more accept for each listener while the socket is under its cap (whoever took
        the monitor's events: the loop's wake-up, or a request from an unseen connection)."""
        if self.count < self.cap:
            for gate in self.gates:
                gate.arm()

    def seen(self, fd: int, peer: str, now: float, identity: bytes | None = None) -> bool:
        """A request from `peer` came in on connection `fd`, owed a reply until
        answered(`identity`) (a subscription, no identity, is owed none); False when the
        peer is banned (its connection is being closed: the request is dropped)."""
        until = self._banned.get(peer) if self._banned else None
        if until is not None:
            if until > now:
                return False
            del self._banned[peer]
        conn = self.by_fd.get(fd)
        if conn is None and fd >= 0:  # its accept is still queued: a sender is no silent one
            self._take_events(now)
            conn = self.by_fd.get(fd)
        if conn is not None and conn.peer == peer:  # else a reused fd: leave the new one be
            conn.last_request = now
            if identity is None:
                return True
            conn.owed += 1
            if conn.identity != identity:
                self._forget(conn)
                conn.identity = identity
                self._by_identity[identity] = conn
        return True

    def answered(self, identity: bytes) -> None:
        """A reply went to `identity`, was dropped or will never come: one less owed."""
        conn = self._by_identity.get(identity)
        if conn is not None and conn.owed:
            conn.owed -= 1

    def _forget(self, conn: Connection | None) -> None:
        if conn is not None and self._by_identity.get(conn.identity) is conn:
            del self._by_identity[conn.identity]

    def ban(self, fd: int, peer: str, now: float, reason: str) -> None:
        """Refuse new connections of `peer` for BAN_S, and close `fd` shortly (its last
        reply leaves first). A peer keyed per connection, or a loopback user, loses that
        connection only."""
        if not peer.startswith(("fd:", "uid:")):
            self._banned[peer] = now + BAN_S
        conn = self.by_fd.get(fd)
        if conn is not None and conn.peer == peer:
            self._close_later.append((now + CLOSE_BANNED_AFTER_S, fd, conn.ino))
        log.warning("peer_banned", peer=peer, seconds=BAN_S, reason=reason, socket=self.name)

    def close_connection(self, fd: int) -> bool:
        """Close connection `fd` now (a revoked key's subscriber); False if it is gone."""
        conn = self.by_fd.get(fd)
        if conn is None:
            return False
        self._close(fd, conn.ino)
        return True

    def enforce(self, now: float) -> None:
        if self._close_later:
            due = [c for c in self._close_later if c[0] <= now]
            self._close_later = [c for c in self._close_later if c[0] > now]
            for _, fd, ino in due:
                self._close(fd, ino)
        if self._listeners:
            self._attach_gates(now)
        if self._closing:
            for fd in [fd for fd, since in self._closing.items()
                       if now - since > CLOSING_FORGET_S]:
                del self._closing[fd]  # its disconnect event was lost: no longer counted
        if len(self.by_fd) >= self.cap:
            self._make_room(now)
        self._arm()
        if self._banned:
            for peer, until in list(self._banned.items()):
                if until <= now:
                    del self._banned[peer]
        counts = (self.closed_idle, self.refused_banned)
        if counts != self._logged_counts and now - self._logged_at >= LOG_EVERY_S:
            closed, refused = (a - b for a, b in zip(counts, self._logged_counts))
            log.warning("connections_limited", socket=self.name, connections=len(self.by_fd),
                        cap=self.cap, closed_idle=closed, refused_banned=refused,
                        window_s=LOG_EVERY_S)
            self._logged_at, self._logged_counts = now, counts

    def shed_quiet(self, now: float, quiet_s: float | None = CLOSE_IDLE_S,
                   spare_new_s: float = 0.0, sending: bool = False) -> int:
        """Memory pressure (server/heap.py): close every connection that never delivered a
        request (a never-ending or huge message is never delivered), then, unless `quiet_s`
        is None, those whose last request is `quiet_s` old (a huge message sent after a
        valid request is not delivered either) and, if `sending`, that have sent bytes
        libzmq has not read at this check and the one before, delivering nothing between:
        a camera's request waiting there is read within one check (cutting an idle camera
        loses the request it sends meanwhile); whatever the cap; how many were closed. A
        connection owed a reply stays (a camera waiting for it would lose it), and so do
        those accepted within `spare_new_s`: a camera's first request may be on its way.
        A subscriber (not `quiet_gives_way`) is quiet by nature and its queue of events is
        bounded (SNDHWM): it goes only while sending, whatever `sending` says. Cutting one
        can also end its process: a SUB cut while events flowed to it aborted in libzmq
        4.3.5's recv ("Assertion failed: !_more (src/fq.cpp:80)", libzmq issue 2163)."""
        sending = sending or not self.quiet_gives_way
        quiet_before = now - quiet_s if quiet_s is not None else 0.0
        new_after = now - spare_new_s
        quiet = [c for c in self.by_fd.values()
                 if not c.owed and ((not c.last_request and c.since <= new_after)
                                    or (0 < c.last_request <= quiet_before
                                        and (not sending or _still_sending(c, now))))]
        for conn in quiet:
            self._close(conn.fd, conn.ino)
        self.shed += len(quiet)
        return len(quiet)

    def stats(self) -> dict[str, int]:
        return {"connections": len(self.by_fd), "cap": self.cap,
                "gated": int(any(g.available for g in self.gates)),
                "closed_idle": self.closed_idle, "refused_banned": self.refused_banned,
                "shed": self.shed}

    def close(self) -> None:
        """Stop arming and monitoring (the monitor's events are unbounded: stopping never
        blocks)."""
        for gate in self.gates:
            gate.close()
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(0)

    def gate_listeners(self) -> None:
        """Right after the bind: gate the new listener as soon as libzmq's I/O thread has
        registered it (well under a millisecond), so that hardly anything is accepted
        ungated; the loop keeps trying for GATE_FIND_S if it is slower than that."""
        end = time.monotonic() + GATE_WAIT_S
        while True:
            self._take_events(time.monotonic())
            self._attach_gates(time.monotonic())
            if not self._listeners or time.monotonic() >= end:
                break
            time.sleep(0.0005)
        self.enforce(time.monotonic())

    # -- inside ------------------------------------------------------------------------------
    def _attach_gates(self, now: float) -> None:
        """Gate each new listener once libzmq's I/O thread has registered it."""
        waiting = []
        for fd, give_up in self._listeners:
            gate = AcceptGate.attach(fd, self.name)
            if gate is not None:
                self.gates.append(gate)
                log.info("accept_gate", socket=self.name, fd=fd, cap=self.cap)
            elif now < give_up:
                waiting.append((fd, give_up))
            else:
                log.warning("accept_gate_unavailable", socket=self.name, fd=fd,
                            reason="libzmq's epoll registration of the listener was not "
                                   "found (no /proc, or libzmq not on epoll)",
                            effect="connections are counted after they are accepted; a "
                                   "flood faster than the loop can exhaust the fds")
        self._listeners = waiting

    def _accepted(self, fd: int, now: float) -> None:
        self.loopback.pop(fd, None)  # a reused number never inherits an earlier user
        self.accepted += 1
        found = accepted_peer(fd)
        if found is None:
            return  # already gone: its disconnect event follows
        peer, ino = found
        self._closing.pop(fd, None)  # the number is reused: the old one was closed
        if peer.startswith(("uid:", "pid:")):  # ipc's metadata names its pid: unused there
            self.loopback[fd] = peer
        until = self._banned.get(peer)
        if until is not None and until > now:
            self.refused_banned += 1
            self._close(fd, ino)
            return
        self._forget(self.by_fd.get(fd))  # one whose disconnect event never came
        self.by_fd[fd] = Connection(fd, ino, peer, now)

    def _make_room(self, now: float) -> None:
        """At the cap: close a few connections so that those waiting get in. First those
        that never sent anything, oldest first, then (where quiet ones give way) those quiet
        for CLOSE_IDLE_S; else the least recently active of a peer holding more than its
        share of the cap, busy or not: no peer can keep the others out."""
        room = max(self.cap // ROOM_DIVISOR, 1)
        quiet_before = now - CLOSE_IDLE_S if self.quiet_gives_way else 0.0
        idle = heapq.nsmallest(room, (c for c in self.by_fd.values()
                                      if not c.last_request
                                      or c.last_request <= quiet_before),
                               key=lambda c: (c.last_request > 0, c.quiet_since()))
        if not idle:
            by_peer: dict[str, list[Connection]] = {}
            for conn in self.by_fd.values():
                by_peer.setdefault(conn.peer, []).append(conn)
            share = -(-self.cap // (len(by_peer) + 1))  # +1: whoever waits to get in
            busiest = max(by_peer.values(), key=len)
            if len(busiest) > share:
                idle = heapq.nsmallest(min(room, len(busiest) - share), busiest,
                                       key=Connection.quiet_since)
        for conn in idle:
            self._close(conn.fd, conn.ino)
            self.closed_idle += 1

    def _close(self, fd: int, ino: int) -> None:
        # Counted out of the open ones now, and among the closing ones until the monitor's
        # disconnect event (or a new accept on the same number) says libzmq closed it.
        conn = self.by_fd.get(fd)
        if conn is not None and conn.ino == ino:
            del self.by_fd[fd]
            self._forget(conn)
        try:
            if os.fstat(fd).st_ino != ino:
                return  # closed already, and the number reused by another connection
        except OSError:
            return
        if self._shutdown is not None:
            self._shutdown(fd, _SHUT_RDWR)
            self._closing[fd] = time.monotonic()
