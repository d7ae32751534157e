"""Reading requests off the ROUTER one frame at a time, with a bound on frames per message.

ZeroMQ bounds a frame's size but not a message's frame count, so a message longer than
MAX_FRAMES is answered `too-large` and the rest dropped a chunk per loop pass, so replies keep
moving; a message of millions of frames is cut by the memory watch (server/heap.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq
from zmq.backend import zmq_poll

from stgcnd.server.peers import peer_key
from stgcnd.server.transport import NOBLOCK, POLLIN
from stgcnd_client.protocol import DEFAULT_LIMITS

MAX_FRAMES = 1 + DEFAULT_LIMITS.max_arrays
DISCARD_PER_PASS = 20_000
BAN_ABOVE_FRAMES = 1000
_SRCFD = int(zmq.SRCFD)


@dataclass
class Incoming:
    identity: bytes
    frames: list[zmq.Frame]
    fd: int                      # the connection it came on (ZMQ_SRCFD; -1 if unknown)
    peer: str                    # who sent it (peers.peer_key)
    too_many: bool = False       # more than MAX_FRAMES frames: the rest is being dropped
    user: str = ""               # CURVE: the sender's public key (ZAP User-Id); else ""


# Peer keys that follow from the address alone (an ipc client's pid, a remote IP), by address:
# one dict lookup a request instead of peer_key's string work. Bounded: emptied when full.
MAX_KNOWN_ADDRESSES = 4096


def _origin(frame: zmq.Frame, loopback: dict[int, str] | None = None,
            known: dict[str, str] | None = None) -> tuple[int, str]:
    """(fd, peer) of a received frame (`loopback`: the users of loopback tcp connections by
    fd, Connections.loopback; `known`: the address-only keys met so far); libzmq knows neither
    for a connection whose address could not be read when it was made (get raises): then
    (-1, "fd:-1")."""
    try:
        fd = int(frame.get(_SRCFD))
    except zmq.ZMQError:
        fd = -1
    try:
        address = str(frame.get("Peer-Address"))
    except zmq.ZMQError:
        address = ""
    if known is None:
        return fd, peer_key(address, fd, loopback)
    peer = known.get(address)
    if peer is None:
        peer = peer_key(address, fd, loopback)
        # Only the keys made of the address (not of the fd, nor of the loopback's table).
        if peer == f"ip:{address}" or (address.startswith("localhost:")
                                       and peer.startswith("pid:")):
            if len(known) >= MAX_KNOWN_ADDRESSES:
                known.clear()
            known[address] = peer  # neither the fd nor the loopback table changes it
    return fd, peer


def _user(frame: zmq.Frame) -> str:
    try:
        return str(frame.get("User-Id"))
    except zmq.ZMQError:
        return ""


# ZeroMQ bounds a frame's size (ZMQ_MAXMSGSIZE) but not how many frames a message has, and
# taking a message whole (recv_multipart) lets one of millions of empty frames stall the loop
# for seconds (docs/performance.md). A request has at most MAX_FRAMES frames after the routing id
# (a header and up to Limits.max_arrays arrays). The receiver hands out the first MAX_FRAMES
# frames of a longer message flagged `too_many` (the loop answers `too-large` once, and bans
# the peer when the message had more than BAN_ABOVE_FRAMES frames: no client bug sends that
# many), then drops the rest DISCARD_PER_PASS frames per loop pass, so that replies and device
# work keep moving between the chunks. The pass that finishes a drop reads nothing more, so
# that the loop settles that message (its ban) before the next one is read.
#
# What it cannot shorten: ZeroMQ keeps a message's frames in order in one pipe, so requests of
# other cameras queued behind it wait until its last frame is dropped (docs/performance.md).
# A message of millions of frames is therefore never let complete: the memory watch cuts its
# connection while it arrives (server/heap.py).
class Receiver:
    def __init__(self, router: zmq.Socket[bytes], max_frames: int = MAX_FRAMES,
                 users: bool = False, loopback: dict[int, str] | None = None) -> None:
        self.router = router
        self._waiting = [(router, POLLIN)]  # zmq_poll's items: a request waiting on the router
        self.loopback = loopback  # Connections.loopback: a loopback connection's user
        self.users = users  # read each message's ZAP User-Id (CURVE only: a property lookup)
        self.max_frames = max_frames
        self.discarding = False
        self.discarded_frames = 0     # ever, for the stats reply
        self.oversized_messages = 0
        self.last_oversized_frames = 0  # frames of the latest oversized message, once dropped
        self._known: dict[str, str] = {}  # address -> peer key, where the address alone says

    def read(self, waiting: bool = False) -> Incoming | None:
        """The next request, or None when none is waiting, or when this call went on
        dropping the rest of an oversized message (call again on the next loop pass).
        `waiting`: the loop's poll has just said one is (its own check is then skipped)."""
        if self.discarding:
            self._discard_some()
            return None
        # Is a message waiting (ZMQ_EVENTS)? zmq_poll answers at 1/3 the instructions of
        # Socket.get(EVENTS), which makes a SocketOption enum in Python first (twice a request),
        # and at a third of a failed recv's (its exception); 1.5 us, two syscalls, so not asked
        # again where the loop's poll just answered it.
        recv = self.router.recv
        if not waiting and not zmq_poll(self._waiting, 0):
            return None
        try:
            identity = recv(NOBLOCK, copy=False)
        except zmq.Again:  # the poll's answer no longer holds (it always does: a guard)
            return None
        frames: list[zmq.Frame] = []
        more = identity.more
        while more:
            if len(frames) == self.max_frames:
                self.discarding = True
                self.oversized_messages += 1
                self.last_oversized_frames = len(frames)
                return Incoming(identity.bytes, frames, *_origin(identity, self.loopback),
                                too_many=True)
            # The rest of a multipart message is always there once its first frame is.
            frame = recv(NOBLOCK, copy=False)
            frames.append(frame)
            more = frame.more
        return Incoming(identity.bytes, frames, *_origin(identity, self.loopback, self._known),
                        user=_user(identity) if self.users else "")

    def _discard_some(self) -> None:
        """Drop up to DISCARD_PER_PASS frames of the oversized message."""
        recv = self.router.recv
        for n in range(1, DISCARD_PER_PASS + 1):
            if not recv(NOBLOCK, copy=False).more:
                self.discarding = False
                self.discarded_frames += n
                self.last_oversized_frames += n
                return
        self.discarded_frames += DISCARD_PER_PASS
        self.last_oversized_frames += DISCARD_PER_PASS
