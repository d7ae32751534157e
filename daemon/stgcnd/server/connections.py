"""Who is connected, and how many: the daemon's file-descriptor budget.

ZeroMQ accepts connections in its own I/O thread and has no per-listener cap. Every accepted
connection costs the process one file descriptor, and when none is left libzmq 4.3 aborts the
process on an ipc listener (`Too many open files (src/ipc_listener.cpp)`) or spins on a tcp one.
A thousand idle peers would kill the daemon. So the I/O loop keeps count, from the ROUTER's
socket monitor (an event with the connection's fd for each accept and each disconnect):

- at start, the soft fd limit is raised to the hard one (systemd's default soft limit is 1024);
- above `max_connections` the loop closes connections at once: first those that never sent a
  request (oldest first), then those quiet for CLOSE_IDLE_S. Past the hard mark, half way
  into the reserve the cap leaves below the fd limit, it closes the least recently active
  connections of the peer holding the most, whether they send or not: a peer that keeps a
  thousand connections busy cannot exhaust the fds either;
- a peer whose message broke the frame limit is refused for BAN_S and its connection closed.

Pausing the listener is no option: zmq_unbind closes every connection accepted through it.
A connection is closed with shutdown(2) on its fd, after checking that the fd is still the
socket that was accepted (its inode): libzmq owns the fd, sees the hang-up and closes it
itself; the descriptor is never closed behind its back. The monitor's socket takes events
without a bound: libzmq's I/O thread blocks on a full monitor pipe (socket_base.cpp).

The peer of a request (`peer_key`) comes from the connection's own metadata (Peer-Address),
not from its fd number, which a new connection may reuse: the process for an ipc client
(SO_PEERCRED; the camera table shares slots by it, bans refuse it) and the address for tcp. A
process in another pid namespace (pid 0) and a tcp client on the loopback are keyed per
connection instead: their key would otherwise lump unrelated clients together.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import os
import resource
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import zmq

from stgcnd.log import get_logger

log = get_logger(__name__)

FD_LIMIT_CEILING = 65536   # raise the soft limit this far at most (large fd tables cost)
FD_RESERVE_MIN = 64        # fds kept for what the daemon opens after READY (reloads, logs)
CONNECTIONS_AUTO_MAX = 4096
CLOSE_IDLE_S = 1.0         # a connection quiet this long may be closed above the cap
BAN_S = 10.0               # a peer that broke the frame limit is refused this long
CLOSE_BANNED_AFTER_S = 0.2  # the banned connection's last reply (too-large) leaves first
LOG_EVERY_S = 60.0         # the connections_limited line, at most once a minute
_SHUT_RDWR = 2
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_LOOPBACK = ("127.", "::1", "::ffff:127.")

_ACCEPTED = int(zmq.EVENT_ACCEPTED)
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
_EVENT = struct.Struct("=HI")     # a monitor message's first frame: event id, value (the fd)
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


def connection_budget(soft_limit: int, in_use: int, configured: int) -> tuple[int, int]:
    """(cap, hard mark) of connections, from the fd limit and the fds open now.

    Of the free fds, a quarter (at least FD_RESERVE_MIN) stays for what the daemon itself
    opens later (reloads, logs); of the rest, the cap takes three quarters (or what is
    configured, up to all of it) and the hard mark sits half way from the cap to the end."""
    free = max(soft_limit - in_use, 0)
    usable = max(free - max(free // 4, FD_RESERVE_MIN), 1)
    cap = min(configured, usable) if configured else min(usable * 3 // 4, CONNECTIONS_AUTO_MAX)
    cap = max(cap, 1)
    return cap, max(cap + (usable - cap) // 2, cap)


def peer_key(address: str, fd: int) -> str:
    """The peer of connection `fd` from its Peer-Address metadata: 'localhost:UID:GID:PID'
    for ipc, the IP for tcp (see the module docstring for who is keyed per connection)."""
    if address.startswith("localhost:"):
        pid = address.rsplit(":", 1)[-1]
        if pid not in ("", "0"):
            return f"pid:{pid}"
    elif address and not address.startswith(_LOOPBACK):
        return f"ip:{address}"
    return f"fd:{fd}"


def accepted_peer(fd: int) -> tuple[str, int] | None:
    """(peer key, inode) of an accepted connection's fd, asked of the kernel (the same key
    `peer_key` makes from a message's metadata); None when the fd is gone or not a socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        ino = os.fstat(fd).st_ino
        if sock.family == socket.AF_UNIX:
            pid, uid, gid = _PEERCRED.unpack(sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
            return peer_key(f"localhost:{uid}:{gid}:{pid}", fd), ino
        return peer_key(str(sock.getpeername()[0]), fd), ino
    except OSError:
        return None
    finally:
        sock.detach()  # the fd is libzmq's: never closed here


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

    def quiet_since(self) -> float:
        return max(self.since, self.last_request)


class Connections:
    """The ROUTER's connections, counted from its monitor; see the module docstring.

    Made before the ROUTER binds, so that no connection is accepted unseen."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], router: zmq.Socket[bytes],
                 cap: int, hard: int) -> None:
        self.router = router
        self.cap = cap
        self.hard = hard
        self.by_fd: dict[int, Connection] = {}
        address = f"inproc://stgcnd-monitor-{next(_unique)}"
        router.monitor(address, _ACCEPTED | _DISCONNECTED)
        self.monitor = ctx.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.RCVHWM, 0)  # never full: libzmq would block its I/O thread
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.connect(address)
        self.closed_idle = 0        # connections closed above the cap, ever
        self.refused_banned = 0     # connections of banned peers closed on sight, ever
        self.shed = 0               # connections closed under memory pressure, ever
        self.accepted = 0           # connections accepted, ever (server/heap.py's growth)
        self._banned: dict[str, float] = {}   # peer -> monotonic time the ban ends
        self._close_later: list[tuple[float, int, int]] = []  # (when, fd, inode)
        self._shutdown = _libc_shutdown()
        self._logged_at = 0.0
        self._logged_counts = (0, 0)

    def __len__(self) -> int:
        return len(self.by_fd)

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
            event, fd = _EVENT.unpack_from(head)
            if event == _ACCEPTED:
                self._accepted(fd, now)
            elif event == _DISCONNECTED:
                self.by_fd.pop(fd, None)

    def seen(self, fd: int, peer: str, now: float) -> bool:
        """A request from `peer` came in on connection `fd`; False when the peer is banned
        (its connection is being closed: the request is dropped)."""
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
        return True

    def ban(self, fd: int, peer: str, now: float, reason: str) -> None:
        """Refuse new connections of `peer` for BAN_S, and close `fd` shortly (its last
        reply leaves first). A peer keyed per connection loses that connection only."""
        if not peer.startswith("fd:"):
            self._banned[peer] = now + BAN_S
        conn = self.by_fd.get(fd)
        if conn is not None and conn.peer == peer:
            self._close_later.append((now + CLOSE_BANNED_AFTER_S, fd, conn.ino))
        log.warning("peer_banned", peer=peer, seconds=BAN_S, reason=reason)

    def enforce(self, now: float) -> None:
        if self._close_later:
            due = [c for c in self._close_later if c[0] <= now]
            self._close_later = [c for c in self._close_later if c[0] > now]
            for _, fd, ino in due:
                self._close(fd, ino)
        count = len(self.by_fd)
        if count > self.cap:
            self._close_idle(count - self.cap, now)
        if len(self.by_fd) > self.hard:
            self._close_busiest_peer(len(self.by_fd) - self.hard)
        if self._banned:
            for peer, until in list(self._banned.items()):
                if until <= now:
                    del self._banned[peer]
        counts = (self.closed_idle, self.refused_banned)
        if counts != self._logged_counts and now - self._logged_at >= LOG_EVERY_S:
            closed, refused = (a - b for a, b in zip(counts, self._logged_counts))
            log.warning("connections_limited", connections=len(self.by_fd), cap=self.cap,
                        closed_idle=closed, refused_banned=refused, window_s=LOG_EVERY_S)
            self._logged_at, self._logged_counts = now, counts

    def shed_quiet(self, now: float, quiet_s: float = CLOSE_IDLE_S) -> int:
        """Memory pressure (server/heap.py): close every connection that never delivered a
        request (a never-ending message is never delivered), then those quiet for `quiet_s`,
        whatever the cap; how many were closed."""
        quiet_before = now - quiet_s
        quiet = [c for c in self.by_fd.values()
                 if not c.last_request or c.last_request <= quiet_before]
        for conn in quiet:
            self._close(conn.fd, conn.ino)
        self.shed += len(quiet)
        return len(quiet)

    def stats(self) -> dict[str, int]:
        return {"connections": len(self.by_fd), "cap": self.cap, "hard": self.hard,
                "closed_idle": self.closed_idle, "refused_banned": self.refused_banned,
                "shed": self.shed}

    def close(self) -> None:
        """Stop monitoring (the monitor's events are unbounded: stopping never blocks)."""
        try:
            self.router.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(0)

    # -- inside ------------------------------------------------------------------------------
    def _accepted(self, fd: int, now: float) -> None:
        self.accepted += 1
        found = accepted_peer(fd)
        if found is None:
            return  # already gone: its disconnect event follows
        peer, ino = found
        until = self._banned.get(peer)
        if until is not None and until > now:
            self.refused_banned += 1
            self._close(fd, ino)
            return
        self.by_fd[fd] = Connection(fd, ino, peer, now)

    def _close_idle(self, excess: int, now: float) -> None:
        """Close up to `excess` connections: those that never sent a request, oldest first,
        then those quiet for CLOSE_IDLE_S, quietest first."""
        quiet_before = now - CLOSE_IDLE_S
        idle = heapq.nsmallest(excess, (c for c in self.by_fd.values()
                                        if not c.last_request
                                        or c.last_request <= quiet_before),
                               key=lambda c: (c.last_request > 0, c.quiet_since()))
        for conn in idle:
            self._close(conn.fd, conn.ino)
            self.closed_idle += 1

    def _close_busiest_peer(self, excess: int) -> None:
        """Past the hard mark: the least recently active connections of the peer that holds
        the most, busy or not."""
        by_peer: dict[str, list[Connection]] = {}
        for conn in self.by_fd.values():
            by_peer.setdefault(conn.peer, []).append(conn)
        busiest = max(by_peer.values(), key=len)
        for conn in heapq.nsmallest(excess, busiest, key=Connection.quiet_since):
            self._close(conn.fd, conn.ino)
            self.closed_idle += 1

    def _close(self, fd: int, ino: int) -> None:
        # Counted out now; the monitor's disconnect event follows (a new accept on the same
        # fd number replaces the entry).
        conn = self.by_fd.get(fd)
        if conn is not None and conn.ino == ino:
            del self.by_fd[fd]
        try:
            if os.fstat(fd).st_ino != ino:
                return  # closed already, and the number reused by another connection
        except OSError:
            return
        if self._shutdown is not None:
            self._shutdown(fd, _SHUT_RDWR)
