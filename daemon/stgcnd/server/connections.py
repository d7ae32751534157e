"""Who is connected, and how many: the daemon's file-descriptor budget.

ZeroMQ accepts connections in its own I/O thread and has no per-listener cap. Every accepted
connection costs the process one file descriptor, and when none is left libzmq 4.3 aborts the
process on an ipc listener (`Too many open files (src/ipc_listener.cpp)`) or spins on a tcp one.
A thousand idle peers would kill the daemon. So the I/O loop keeps count, from the ROUTER's
socket monitor (an event with the connection's fd for each accept and each disconnect):

- at start, the soft fd limit is raised to the hard one (systemd's default soft limit is 1024);
- above `max_connections` the loop closes connections at once, first those that never sent a
  request (oldest first), then those quiet for CLOSE_IDLE_S: an idle peer gives way to a new
  one, a camera that sends never does. The cap leaves a reserve below the fd limit for what
  accepts faster than the loop turns;
- a peer whose message broke the frame limit is disconnected and refused for BAN_S.

Pausing the listener is no option: zmq_unbind closes every connection accepted through it.
A connection is closed with shutdown(2) on its fd: libzmq owns the fd, sees the hang-up, and
closes it itself; the descriptor is never closed behind its back.

The peer behind a connection (`peer_of`) is what the camera table shares slots by: the process
for an ipc socket (SO_PEERCRED: many connections of one process are one peer) and the address
for tcp. A client can invent camera ids and open connections, not processes or addresses.
"""

from __future__ import annotations

import ctypes
import os
import resource
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from stgcnd.log import get_logger

log = get_logger(__name__)

FD_LIMIT_CEILING = 65536   # raise the soft limit this far at most (large fd tables cost)
FD_RESERVE_MIN = 64        # fds kept for what the daemon opens after READY (reloads, logs)
CONNECTIONS_AUTO_MAX = 4096
CLOSE_IDLE_S = 1.0         # a connection quiet this long may be closed above the cap
BAN_S = 10.0               # a peer that broke the frame limit is refused this long
LOG_EVERY_S = 60.0         # the connections_limited line, at most once a minute
_SHUT_RDWR = 2
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

_ACCEPTED = int(zmq.EVENT_ACCEPTED)
_DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
_EVENT = struct.Struct("=HI")     # a monitor message's first frame: event id, value (the fd)
_NOBLOCK = int(zmq.NOBLOCK)


def raise_fd_limit(ceiling: int = FD_LIMIT_CEILING) -> tuple[int, int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most `ceiling`).

    Returns (soft before, soft now, hard)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else ceiling
    target = min(target, ceiling)
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
    """How many connections to keep at most, from the fd limit and the fds open now.

    Of the free fds, a quarter (at least FD_RESERVE_MIN) stays for what the daemon itself
    opens later (reloads, logs); of the rest, a quarter absorbs accepts that come faster than
    the loop closes the excess. A configured cap is honoured up to what is usable."""
    free = max(soft_limit - in_use, 0)
    usable = max(free - max(free // 4, FD_RESERVE_MIN), 1)
    cap = min(configured, usable) if configured else min(usable * 3 // 4, CONNECTIONS_AUTO_MAX)
    return max(cap, 1)


def peer_of(fd: int) -> str | None:
    """The process (ipc) or address (tcp) on the other end of connection `fd`; None when the
    fd is gone or not a socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.family == socket.AF_UNIX:
            pid, _uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET,
                                                           socket.SO_PEERCRED, _PEERCRED.size))
            return f"pid:{pid}"
        return f"ip:{sock.getpeername()[0]}"
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
    return fn


@dataclass
class Connection:
    fd: int
    peer: str
    since: float                 # monotonic: accepted (or first seen)
    last_request: float = 0.0    # monotonic: its last request; 0 = none yet

    def quiet_since(self) -> float:
        return max(self.since, self.last_request)


class Connections:
    """The ROUTER's connections, counted from its monitor; see the module docstring."""

    def __init__(self, router: zmq.Socket, cap: int) -> None:
        self.router = router
        self.cap = cap
        self.by_fd: dict[int, Connection] = {}
        self.monitor = router.get_monitor_socket(_ACCEPTED | _DISCONNECTED)
        self.closed_idle = 0        # connections closed for being idle above the cap, ever
        self.refused_banned = 0     # connections of banned peers closed on sight, ever
        self.shed = 0               # connections closed under memory pressure, ever
        self._banned: dict[str, float] = {}   # peer -> monotonic time the ban ends
        self._shutdown = _libc_shutdown()
        self._logged_at = 0.0
        self._logged_counts = (0, 0)

    def __len__(self) -> int:
        return len(self.by_fd)

    # -- what the I/O loop calls -----------------------------------------------------------
    def on_monitor(self, now: float) -> None:
        """Take the monitor's pending events, then keep the count inside the budget."""
        monitor = self.monitor
        while monitor.get(zmq.EVENTS) & zmq.POLLIN:
            head = monitor.recv(_NOBLOCK)
            monitor.recv(_NOBLOCK)  # the endpoint frame
            event, fd = _EVENT.unpack_from(head)
            if event == _ACCEPTED:
                self._accepted(fd, now)
            elif event == _DISCONNECTED:
                self.by_fd.pop(fd, None)
        self.enforce(now)

    def seen(self, fd: int, now: float) -> str:
        """A request came in on connection `fd`: its peer (see peer_of)."""
        conn = self.by_fd.get(fd)
        if conn is None:  # its accept event is still queued on the monitor
            conn = self._accepted(fd, now)
            if conn is None:
                return f"fd:{fd}"
        conn.last_request = now
        return conn.peer

    def ban(self, fd: int, peer: str, now: float, reason: str) -> None:
        """Disconnect `fd` and refuse new connections of `peer` for BAN_S."""
        self._banned[peer] = now + BAN_S
        conn = self.by_fd.get(fd)
        if conn is not None and conn.peer == peer:  # not closed and reused by another
            self._close(fd)
        log.warning("peer_banned", peer=peer, seconds=BAN_S, reason=reason)

    def enforce(self, now: float) -> None:
        count = len(self.by_fd)
        if count > self.cap:
            self._close_idle(count - self.cap, now)
            count = len(self.by_fd)
        if self._banned:
            for peer, until in list(self._banned.items()):
                if until <= now:
                    del self._banned[peer]
        counts = (self.closed_idle, self.refused_banned)
        if counts != self._logged_counts and now - self._logged_at >= LOG_EVERY_S:
            closed, refused = (a - b for a, b in zip(counts, self._logged_counts))
            log.warning("connections_limited", connections=count, cap=self.cap,
                        closed_idle=closed, refused_banned=refused, window_s=LOG_EVERY_S)
            self._logged_at, self._logged_counts = now, counts

    def shed_quiet(self, now: float) -> int:
        """Memory pressure (server/heap.py): close every connection that delivered no
        request for CLOSE_IDLE_S, whatever the cap; how many were closed."""
        quiet_before = now - CLOSE_IDLE_S
        quiet = [c.fd for c in self.by_fd.values() if c.quiet_since() <= quiet_before]
        for fd in quiet:
            self._close(fd)
        self.shed += len(quiet)
        return len(quiet)

    def stats(self) -> dict[str, int]:
        return {"connections": len(self.by_fd), "cap": self.cap,
                "closed_idle": self.closed_idle, "refused_banned": self.refused_banned,
                "shed": self.shed}

    def close(self) -> None:
        try:
            self.router.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(0)

    # -- inside ------------------------------------------------------------------------------
    def _accepted(self, fd: int, now: float) -> Connection | None:
        known = self.by_fd.get(fd)
        if known is not None:  # seen() met its first request before this accept event
            return known
        peer = peer_of(fd)
        if peer is None:
            return None
        until = self._banned.get(peer)
        if until is not None and until > now:
            self.refused_banned += 1
            self._close(fd)
            return None
        conn = self.by_fd[fd] = Connection(fd, peer, now)
        return conn

    def _close_idle(self, excess: int, now: float) -> None:
        """Close up to `excess` connections: those that never sent a request, oldest first,
        then those quiet for CLOSE_IDLE_S, quietest first."""
        quiet_before = now - CLOSE_IDLE_S
        idle = sorted((c for c in self.by_fd.values()
                       if not c.last_request or c.last_request <= quiet_before),
                      key=lambda c: (c.last_request > 0, c.quiet_since()))
        for conn in idle[:excess]:
            self._close(conn.fd)
            self.closed_idle += 1

    def _close(self, fd: int) -> None:
        # The monitor's disconnect event removes it from by_fd; until then it is not counted
        # twice (a new accept on the same fd number replaces the entry).
        self.by_fd.pop(fd, None)
        if self._shutdown is not None:
            self._shutdown(fd, _SHUT_RDWR)
