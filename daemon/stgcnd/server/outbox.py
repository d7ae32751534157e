"""Replies travelling from the executors back to the I/O loop, which alone owns the ROUTER.

Executors append finished replies to a deque and send one empty wake-up message per batch on
their own inproc PUSH socket (ZeroMQ sockets are single-threaded); the loop polls the PULL end
next to the ROUTER, so a finished batch wakes it as fast as a client's request does.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

from stgcnd.server.scheduler import Job
from stgcnd.server.transport import EVENTS, NOBLOCK, POLLIN

_ids = itertools.count()


@dataclass
class Reply:
    job: Job
    frames: list[bytes]
    outcome: str                # "ok", "error", "expired", "shutting-down"
    timings: dict[str, float] = field(default_factory=dict)


class Outbox:
    def __init__(self, ctx: zmq.Context) -> None:
        self._ctx = ctx
        self._items: deque[Reply] = deque()
        self.endpoint = f"inproc://stgcnd-outbox-{next(_ids)}"
        self.reader = ctx.socket(zmq.PULL)
        self.reader.setsockopt(zmq.LINGER, 0)
        self.reader.bind(self.endpoint)

    def writer(self) -> zmq.Socket:
        """A producer thread's own wake-up socket (create and close it in that thread)."""
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        return sock

    def put(self, replies: list[Reply], writer: zmq.Socket) -> None:
        self._items.extend(replies)  # deque appends are atomic: no lock needed
        try:
            writer.send(b"", NOBLOCK)
        except zmq.Again:  # a thousand wake-ups already queued: the loop is awake anyway
            pass

    def take_all(self) -> list[Reply]:
        """Everything delivered so far; clears pending wake-ups first, so a reply appended
        after this call always comes with a wake-up of its own."""
        # Checking EVENTS costs a getsockopt; a NOBLOCK recv on an empty socket raises
        # zmq.Again, whose construction costs ~10x that, and this runs every loop pass.
        reader = self.reader
        while reader.get(EVENTS) & POLLIN:
            reader.recv(NOBLOCK)
        items = self._items
        out: list[Any] = []
        while items:
            out.append(items.popleft())
        return out

    def close(self) -> None:
        self.reader.close(0)
