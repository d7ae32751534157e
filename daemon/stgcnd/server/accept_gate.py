"""One accept at a time: a listener's epoll registration is made one-shot (EPOLLONESHOT) and
re-armed only while descriptors are to spare, so the daemon, not libzmq, decides when a
connection is taken (libzmq aborts on EMFILE; server/connections.py). Without /proc or an
epoll-based libzmq there is no gate: the connection count alone keeps the budget."""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Callable

from stgcnd.log import get_logger

log = get_logger(__name__)

EPOLLIN = 0x001
EPOLLONESHOT = 1 << 30
_EPOLL_CTL_MOD = 3
# struct epoll_event is packed on x86-64 only (the kernel's EPOLL_PACKED).
_EVENT = struct.Struct("=IQ" if platform.machine() in ("x86_64", "AMD64") else "IxxxxQ")


def _epoll_ctl() -> Callable[[int, int, int, bytes], int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).epoll_ctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p]
    fn.restype = ctypes.c_int
    return fn


_CTL = _epoll_ctl()


def find_registration(fd: int) -> tuple[int, int] | None:
    """(epoll fd, data) of the epoll registration that watches listening socket `fd` (its
    inode checked, so that a reused number is never taken for it); None when not found."""
    try:
        ino = os.fstat(fd).st_ino
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") != "anon_inode:[eventpoll]":
                continue
            with open(f"/proc/self/fdinfo/{name}") as info:
                lines = info.read().splitlines()
        except OSError:
            continue
        for line in lines:
            # "tfd:       12 events:       19 data:     7fd624000b70  pos:0 ino:10e1 sdev:9"
            fields = line.split()
            if len(fields) < 6 or fields[0] != "tfd:" or int(fields[1]) != fd:
                continue
            extra = dict(f.split(":", 1) for f in fields[6:] if ":" in f)
            if "ino" in extra and int(extra["ino"], 16) != ino:
                continue
            return int(name), int(fields[5], 16)
    return None


# libzmq accepts in its I/O thread as fast as peers connect, one fd each, and an ipc listener
# that meets EMFILE aborts the process (ipc_listener.cpp asserts on it). Counting accepts after
# the fact loses that race to a flood. So the listener's registration in libzmq's epoll set is
# made one-shot (EPOLLONESHOT): libzmq accepts one connection per readiness event, after which
# the kernel disarms the registration until the loop arms it again, which it does only while
# the process has descriptors to spare. Further connections wait in the kernel's backlog and
# cost the daemon nothing.
#
# The registration is read from /proc/self/fdinfo of libzmq's epoll descriptor (target fd,
# inode, and `data`: libzmq's own pointer, handed back unchanged). Only EPOLL_CTL_MOD is used,
# never ADD: on a registration libzmq already removed it fails harmlessly (ENOENT). Where the
# registration cannot be found (no /proc, libzmq on poll(2)), the gate is unavailable and the
# connection count alone keeps the budget (server/connections.py).
class AcceptGate:
    """Arms a listener for one accept at a time (see the comment above the class)."""

    def __init__(self, listen_fd: int, epfd: int, data: int, name: str) -> None:
        self.fd = listen_fd
        self.name = name
        self._epfd, self._data = epfd, data
        self.available = True
        self.armed = False
        self._closed = False
        # From level-triggered to one-shot, disarmed until the owner arms it.
        self._mod(EPOLLONESHOT)

    @classmethod
    def attach(cls, listen_fd: int, name: str) -> AcceptGate | None:
        """The gate of `listen_fd`, or None while libzmq's I/O thread has not registered the
        listener yet (it does so shortly after the bind) or where it cannot be found."""
        found = find_registration(listen_fd) if _CTL is not None else None
        if found is None:
            return None
        return cls(listen_fd, *found, name)

    def arm(self) -> None:
        """Let libzmq accept one more connection (a no-op when already armed)."""
        if self.available and not self.armed and not self._closed:
            self.armed = self._mod(EPOLLIN | EPOLLONESHOT)

    def consumed(self) -> None:
        """libzmq reported an accept (or a failed one): the arming is spent."""
        self.armed = False

    def close(self) -> None:
        """No more arming: libzmq is about to close the listener."""
        self._closed = True

    def _mod(self, events: int) -> bool:
        assert _CTL is not None
        if _CTL(self._epfd, _EPOLL_CTL_MOD, self.fd, _EVENT.pack(events, self._data)) == 0:
            return True
        err = ctypes.get_errno()
        self.available = False
        # Back to level-triggered, so that a failed gate never leaves the listener shut
        # (on a registration libzmq already removed this fails too, harmlessly).
        _CTL(self._epfd, _EPOLL_CTL_MOD, self.fd, _EVENT.pack(EPOLLIN, self._data))
        log.error("accept_gate_failed", socket=self.name, error=os.strerror(err),
                  effect="connections are counted after they are accepted")
        return False
