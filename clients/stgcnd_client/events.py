"""Subscribing to stgcnd's action events (the daemon's `events_endpoint`, docs/protocol.md
"Events"): `with Events(endpoint, cameras=[...]) as events: for event in events: ...`.

One message per event start and end, and at subscribing a "snapshot" of each event already
open. Every message is numbered within the daemon's run: a lost one raises `EventsGap` (a new
snapshot follows), and silence past the daemon's heartbeats raises `NoHeartbeat`, so that
iterating ends when the daemon is gone instead of waiting for ever.
"""

from __future__ import annotations

import math
import time
from typing import Dict, Iterable, Iterator, Union

import msgspec
import zmq

from .curve import ClientKey, KeySource, curve_options
from .endpoint import parse_endpoint
from .errors import EventsGap, NoHeartbeat

Event = Dict[str, Union[str, float]]  # see docs/protocol.md "Events" for the keys

_DECODER = msgspec.msgpack.Decoder()
HEARTBEAT_TOPIC = b"\xffheartbeat"  # the daemon's (server/event_publisher.py): no camera id's
MISSED_HEARTBEATS = 3  # silent this many heartbeat intervals: the daemon is gone
# Until the first heartbeat: the connection, a CURVE handshake, the subscription reaching the
# daemon (each is answered with a heartbeat at once) and a daemon still starting.
FIRST_HEARTBEAT_S = 10.0


class Events:
    """A SUB socket on the daemon's events endpoint; `cameras`: only these (default: all)."""

    def __init__(self, endpoint: str, cameras: Iterable[str] | None = None,
                 context: zmq.Context[zmq.Socket[bytes]] | None = None,
                 server_key: KeySource | None = None,
                 client_key: ClientKey | None = None,
                 heartbeat_timeout_s: float | None = None,
                 heartbeats: bool = False, feeds: bool = False) -> None:
        """`server_key` and `client_key`: for a daemon whose [server] curve is on, as for
        `Client` (stgcnd_client.curve). `heartbeat_timeout_s`: how long nothing may arrive
        before `NoHeartbeat` (default: three of the daemon's heartbeat intervals; before the
        first heartbeat, FIRST_HEARTBEAT_S). `heartbeats`: return heartbeats too. `feeds`:
        return `feed` messages too (a camera's feed health changed), which are no events."""
        parse_endpoint(endpoint)  # a wrong endpoint fails here, not as a ZMQError
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket[bytes] = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 1 << 20)  # an event is a few hundred bytes
        for option, value in curve_options(server_key, client_key):
            self._sock.setsockopt(option, value)
        # Every topic, the cameras chosen here: the numbers count every message the daemon
        # sends, so only the whole stream shows a gap (events are rare and small).
        self._cameras = None if cameras is None else {c.encode() for c in cameras}
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.connect(endpoint)
        self._heartbeats = heartbeats
        self._feeds = feeds
        self._timeout_s = heartbeat_timeout_s  # None: from the daemon's heartbeats
        self._silence_s: float | None = heartbeat_timeout_s or FIRST_HEARTBEAT_S
        self._silent_after: float | None = time.monotonic() + self._silence_s
        self._run: str | None = None
        self._seq = 0
        self._held: Event | None = None  # the message that showed a gap, returned next
        self._open: set[str] = set()  # ids of the events returned open: a snapshot repeats

    def recv(self, timeout_ms: int | None = None) -> Event | None:
        """The next event, or None when `timeout_ms` passes first (None: wait). Raises
        `EventsGap` when messages were lost, `NoHeartbeat` when the daemon fell silent."""
        until = None if timeout_ms is None else time.monotonic() + timeout_ms / 1e3
        while True:
            held, self._held = self._held, None
            if held is not None:
                return held
            stop = min((t for t in (until, self._silent_after) if t is not None), default=None)
            wait_ms = None if stop is None else max(
                math.ceil((stop - time.monotonic()) * 1e3), 0)
            if wait_ms is not None and not self._sock.poll(wait_ms):
                now = time.monotonic()
                if self._silent_after is not None and now >= self._silent_after:
                    # Raised once; reading on waits for the daemon (the socket reconnects).
                    self._silent_after = now + (self._silence_s or FIRST_HEARTBEAT_S)
                    raise NoHeartbeat("no heartbeat from the stgcnd daemon's events endpoint "
                                      "in time: it stopped, or cannot be reached")
                if until is not None and now >= until:
                    return None
                continue
            taken = self._take(self._sock.recv_multipart())
            if taken is not None:
                return taken

    def _take(self, frames: list[bytes]) -> Event | None:
        """A message's event, if it is one to return; its number checked."""
        if len(frames) != 2:
            return None
        event = _DECODER.decode(frames[1])
        if not isinstance(event, dict):
            return None
        if event.get("kind") == "heartbeat" and self._timeout_s is None:
            # A daemon without heartbeats (interval 0) cannot be told from a calm one.
            self._silence_s = MISSED_HEARTBEATS * float(event.get("interval_s") or 0) or None
        self._silent_after = (None if self._silence_s is None
                              else time.monotonic() + self._silence_s)
        wanted = (self._heartbeats if frames[0] == HEARTBEAT_TOPIC
                  else (self._cameras is None or frames[0] in self._cameras)
                  and (self._feeds or event.get("kind") != "feed"))
        run, seq = event.get("run"), event.get("seq")
        last_run, last_seq = self._run, self._seq
        self._run, self._seq = str(run), int(seq or 0)
        if last_run is not None and (run, seq) != (last_run, last_seq + 1):
            self._open.clear()  # the caller forgets too: the snapshot tells it all again
            self._held = event if wanted and self._new(event) else None
            if run != last_run:  # restarted: its reconnection brings a snapshot
                raise EventsGap(f"the stgcnd daemon restarted (run {last_run} -> {run})", None)
            self._sock.setsockopt(zmq.SUBSCRIBE, b"")  # asks the daemon for a snapshot
            missed = self._seq - last_seq - 1
            raise EventsGap(f"{missed} event message(s) lost (seq {last_seq} -> {seq}); "
                            "a snapshot of the open events follows", missed)
        return event if wanted and self._new(event) else None

    def _new(self, event: Event) -> bool:
        """False for a snapshot of an event already returned open (another subscriber's
        subscription brings one to every subscriber of its topic)."""
        kind, key = event.get("kind"), str(event.get("id"))
        if kind == "end":
            self._open.discard(key)
        elif kind in ("start", "snapshot"):
            if kind == "snapshot" and key in self._open:
                return False
            self._open.add(key)
        return True

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
