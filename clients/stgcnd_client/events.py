"""Subscribing to stgcnd's action events (the daemon's `events_endpoint`, docs/protocol.md
"Events"): `with Events(endpoint, cameras=[...]) as events: for event in events: ...`.

One message per event start and end; a late or slow subscriber misses events (PUB/SUB keeps
no history), which the daemon's log (`action_event` lines) has.
"""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, Union

import msgpack
import zmq

from .curve import ClientKey, KeySource, curve_options
from .endpoint import parse_endpoint

Event = Dict[str, Union[str, float]]  # see docs/protocol.md "Events" for the keys


class Events:
    """A SUB socket on the daemon's events endpoint; `cameras`: only these (default: all)."""

    def __init__(self, endpoint: str, cameras: Iterable[str] | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 server_key: KeySource | None = None,
                 client_key: ClientKey | None = None) -> None:
        """`server_key` and `client_key`: for a daemon whose [server] curve is on, as for
        `Client` (stgcnd_client.curve)."""
        parse_endpoint(endpoint)  # a wrong endpoint fails here, not as a ZMQError
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket[bytes] = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 1 << 20)  # an event is a few hundred bytes
        for option, value in curve_options(server_key, client_key):
            self._sock.setsockopt(option, value)
        # Topics are prefixes: the camera id and its NUL-free end are matched exactly by
        # checking the topic frame again on receipt.
        self._cameras = None if cameras is None else {c.encode() for c in cameras}
        for topic in self._cameras or (b"",):
            self._sock.setsockopt(zmq.SUBSCRIBE, topic)
        self._sock.connect(endpoint)

    def recv(self, timeout_ms: int | None = None) -> Event | None:
        """The next event, or None when `timeout_ms` passes first (None: wait)."""
        while True:
            if timeout_ms is not None and not self._sock.poll(timeout_ms):
                return None
            frames = self._sock.recv_multipart()
            if len(frames) != 2 or (self._cameras is not None
                                    and frames[0] not in self._cameras):
                continue  # another camera whose id starts like ours, or not an event
            event: Event = msgpack.unpackb(frames[1], raw=False)
            return event

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self.recv()
            if event is not None:
                yield event

    def close(self) -> None:
        self._sock.close(0)

    def __enter__(self) -> Events:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
