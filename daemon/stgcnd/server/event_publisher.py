"""Where the events feed goes besides the log: the XPUB subscriber socket (`events_endpoint`),
guarded like the requests one, with its snapshots and heartbeats, and the sinks ([events.mqtt]).
Loaded only where one of them is configured (server/event_hub.py); what the messages say
is the rules' (server/events.py) and feed health's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Dict, Mapping, Protocol

import msgspec
import zmq

from stgcnd.errors import UserError
from stgcnd.log import get_logger
from stgcnd.server.config import Config
from stgcnd.server.connections import Connections
from stgcnd.server.curve_policy import KeyHandler
from stgcnd.server.open_events import RESTART_REASON, OpenEventsFile, default_path
from stgcnd.server.peers import keyed_per_connection, peer_key
from stgcnd.server.snapshots import PEER_SUBSCRIPTION_MESSAGES, SNAPSHOT_INTERVAL_S, SnapshotAsks
from stgcnd.server.transport import HANDSHAKE_MS, bind_endpoint

# events_subscriber_cut keeps the module it was said by (a reader's filter).
log = get_logger("stgcnd.server.events")
_ENCODER = msgspec.msgpack.Encoder()  # kept: reuses its buffer for every message

Event = Dict[str, object]

EVENTS_SNDHWM = 1000           # events queued per subscriber (a few hundred bytes each)
MAX_SUBSCRIPTION_BYTES = 1024  # a camera id is at most 128 characters (512 bytes of UTF-8)
MAX_SUBSCRIPTIONS = 1024       # topics one events connection may hold
MAX_SUBSCRIPTION_MESSAGES = 8192  # (un)subscriptions one connection may send, ever
READ_BURST = 256               # subscriptions read per loop pass
HEARTBEAT_TOPIC = b"\xffheartbeat"  # no camera id's topic: 0xFF is never in UTF-8
RESTART_ENDS_S = 60.0  # how long after a start snapshots carry a crashed run's ends
_SRCFD = int(zmq.SRCFD)


def _user(frame: zmq.Frame) -> str:
    try:
        return str(frame.get("User-Id"))
    except zmq.ZMQError:
        return ""


class Sink(Protocol):
    """Where the feed's messages go besides the XPUB socket (server/mqtt_sink.py)."""

    def send(self, message: Mapping[str, object]) -> None: ...
    def announce(self, camera: str, classes: list[str], feed: str) -> None: ...
    def still_here(self, cameras: list[str]) -> None: ...
    def stats(self) -> dict[str, object]: ...
    def close(self) -> None: ...


class Publisher:
    """Where `events_endpoint` is set, an XPUB socket: each message [camera id, msgpack map].
    A slow subscriber loses messages at its high-water mark (the daemon never waits for one)
    and sees the gap by their numbers; heartbeats and snapshots: docs/protocol.md §11. Each
    event goes to the sinks too ([events.mqtt]), which never wait either.

    The socket is guarded like the requests one: its connections are counted and gated
    (server/connections.py), a subscription longer than any camera id drops its connection
    inside libzmq (MAXMSGSIZE), and the loop reads every subscription (XPUB_VERBOSER), so
    that a subscriber over MAX_SUBSCRIPTIONS, or sending more than MAX_SUBSCRIPTION_MESSAGES,
    is cut off and its peer banned, and one whose CURVE key was revoked is cut at the reload.
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], config: Config,
                 curve: KeyHandler | None = None, cap: int = 0) -> None:
        """`curve`: CURVE for the socket (server/curve.py), where the daemon has it: a
        subscriber then needs an authorized key (any: camera bindings are not applied).
        `cap`: the most subscriber connections (server/connections.py's split_budget)."""
        self.curve = curve
        self._pub: zmq.Socket[bytes] | None = None
        self.connections: Connections | None = None
        self._ipc_path: Path | None = None
        self._subscribed: dict[int, tuple[int, int, int]] = {}  # fd -> (inode, now, ever)
        self._users: dict[int, tuple[int, str]] = {}  # fd -> (inode, CURVE key)
        self.refused_subscribers = 0
        self._next_beat = 0.0
        self._heartbeat_s = config.server.events_heartbeat_s
        self.snapshots = SnapshotAsks()  # who asked for one, when each may have it
        endpoint = config.server.events_endpoint
        # The events open on the socket, on disk: a crashed run's are ended at the next start
        # (`restart_ends`, which the hub publishes, and snapshots carry for RESTART_ENDS_S).
        self._opened: dict[str, Event] = {}
        self._saved = OpenEventsFile(default_path(endpoint)) if endpoint else None
        self.restart_ends = [] if self._saved is None else self._saved.ended(time.time())
        self._restart_until = time.monotonic() + RESTART_ENDS_S
        if endpoint:
            pub = ctx.socket(zmq.XPUB)
            pub.setsockopt(zmq.LINGER, 200)  # the shutdown's end events, if they can go
            pub.setsockopt(zmq.SNDHWM, EVENTS_SNDHWM)
            pub.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription, for the counts
            pub.setsockopt(zmq.MAXMSGSIZE, MAX_SUBSCRIPTION_BYTES)
            pub.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
            if curve is not None:
                curve.secure(pub)
            self.connections = Connections(ctx, pub, max(cap, 1), name="events",
                                           quiet_gives_way=False)
            try:
                self._ipc_path = bind_endpoint(pub, endpoint, config.server.socket_mode,
                                               f"cannot publish events on {endpoint}",
                                               "choose another events_endpoint")
            except UserError:
                self.connections.close()
                pub.close(0)
                raise
            self.connections.gate_listeners()
            self._pub = pub
        self.sinks: dict[str, Sink] = {}
        if config.events.mqtt is not None:  # paho loads only where a broker is configured
            from stgcnd.server.mqtt_sink import MqttSink
            self.sinks["mqtt"] = MqttSink(config.events.mqtt)

    @property
    def socket(self) -> zmq.Socket[bytes] | None:
        return self._pub

    def read(self, now: float) -> bool:
        """The subscriptions waiting (at most READ_BURST a pass): each is counted against its
        connection, which is cut off past the limits or when its key is not (or no longer)
        authorized. True when none was left waiting."""
        pub, connections = self._pub, self.connections
        if pub is None or connections is None:
            return True
        for _ in range(READ_BURST):
            try:
                frame = pub.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return True
            try:
                fd = int(frame.get(_SRCFD))
                peer = peer_key(str(frame.get("Peer-Address")), fd, connections.loopback)
            except zmq.ZMQError:  # a pipe's end (libzmq's own unsubscription): no origin
                continue
            if not connections.seen(fd, peer, now):
                continue  # a banned peer's: its connection is being closed
            conn = connections.by_fd.get(fd)
            if conn is None:
                continue
            ino, held, ever = self._subscribed.get(fd, (conn.ino, 0, 0))
            if ino != conn.ino:
                held, ever = 0, 0  # a reused number: a new subscriber
            subscribe = frame.bytes[:1] == b"\x01"
            held = held + 1 if subscribe else max(held - 1, 0)
            self._subscribed[fd] = (conn.ino, held, ever + 1)
            if held > MAX_SUBSCRIPTIONS or ever + 1 > MAX_SUBSCRIPTION_MESSAGES:
                self.refused_subscribers += 1
                self._subscribed.pop(fd, None)
                connections.ban(fd, peer, now, f"more than {MAX_SUBSCRIPTIONS} subscriptions "
                                f"or {MAX_SUBSCRIPTION_MESSAGES} (un)subscriptions on one "
                                "events connection")
                continue
            if self.snapshots.over(peer, now) and (ever + 1 > MAX_SUBSCRIPTIONS
                                                   or not keyed_per_connection(peer)):
                self._refuse_churner(fd, peer, now)
                continue
            if self.curve is not None:
                user = _user(frame)
                self._users[fd] = (conn.ino, user)
                if user not in self.curve.keys:
                    self._cut(fd, user, "key-revoked")
                    continue
            if subscribe:
                self.snapshots.subscribe(fd, conn.ino, peer, frame.bytes[1:], now)
            else:
                self.snapshots.unsubscribe(fd, conn.ino, frame.bytes[1:])
        return False

    def _refuse_churner(self, fd: int, peer: str, now: float) -> None:
        """A peer over its (un)subscriptions per interval (server/snapshots.py): banned, one
        log line an interval. A loopback user's or a connection's peer is not refused as a
        whole: each of its connections that sent more than a subscriber may hold is closed
        (quietly after the first), and one that sent less (a legitimate subscriber of the
        same user) is spared."""
        assert self.connections is not None
        self.refused_subscribers += 1
        self._subscribed.pop(fd, None)
        if self.snapshots.first_refusal(peer):
            self.connections.ban(fd, peer, now, f"more than {PEER_SUBSCRIPTION_MESSAGES} "
                                 f"(un)subscriptions in {SNAPSHOT_INTERVAL_S:g} s over one "
                                 "peer's events connections")
        else:
            self.connections.close_connection(fd)

    def beat(self, now: float, open_events: Callable[[float], list[Event]]) -> list[Event]:
        """Every loop pass: the snapshots due (server/snapshots.py) of `open_events(wall)`,
        then a heartbeat where a topic answered receives it, which also comes every
        `events_heartbeat_s`; the messages to publish."""
        if self._pub is None:
            return []
        out: list[Event] = []
        topics = self.snapshots.due(now)
        if topics:
            # A crashed run's ends first (a subscriber that held those events open learns
            # they ended), then what is open now.
            ended = self.restart_ends if now < self._restart_until else []
            out = [e for e in [*ended, *open_events(time.time())]
                   if any(str(e["camera"]).encode().startswith(t) for t in topics)]
        if not (topics and any(HEARTBEAT_TOPIC.startswith(t) for t in topics)) and (
                not self._heartbeat_s or now < self._next_beat):
            return out
        self._next_beat = now + self._heartbeat_s
        wall = time.time()
        out.append({"kind": "heartbeat", "at": round(wall, 3),
                    "open": len(open_events(wall)), "interval_s": self._heartbeat_s})
        return out

    def drop_revoked(self) -> None:
        """After a reload of the authorized keys: cut every subscriber whose key went (its
        SUB reconnects, and the handshake refuses the key)."""
        if self.curve is None or self.connections is None:
            return
        keys = self.curve.keys
        for fd, (_, user) in list(self._users.items()):
            if user not in keys:
                self._cut(fd, user, "key-revoked")

    def tidy(self, now: float) -> None:
        """Every stats tick: forget the counts of connections that are gone, and hold the
        subscribers' connections to their budget."""
        if self.connections is None:
            return
        if self._saved is not None and self._opened:  # the crash's date: within an interval
            self._saved.save(self._opened, time.time())
        live = self.connections.by_fd
        self.snapshots.tidy({fd: c.ino for fd, c in live.items()}, time.monotonic())
        for table in (self._subscribed, self._users):
            for fd in [fd for fd, v in table.items()
                       if fd not in live or live[fd].ino != v[0]]:
                del table[fd]
        self.connections.enforce(now)

    def _cut(self, fd: int, user: str, reason: str) -> None:
        assert self.connections is not None
        ino = self._users.pop(fd, (0, ""))[0]
        self._subscribed.pop(fd, None)
        conn = self.connections.by_fd.get(fd)
        if conn is not None and conn.ino == ino and self.connections.close_connection(fd):
            log.warning("events_subscriber_cut", client_key=user, reason=reason)

    def send(self, message: Mapping[str, object]) -> None:
        """One numbered message: on the socket (an XPUB drops at a subscriber's high-water
        mark), and to the sinks but for heartbeats, snapshots and a crashed run's ends (a
        broker keeps its own state topic, from which the MQTT sink ends them itself)."""
        kind = message["kind"]
        if self._pub is not None:
            topic = HEARTBEAT_TOPIC if kind == "heartbeat" else str(message["camera"]).encode()
            self._pub.send_multipart([topic, _ENCODER.encode(message)], zmq.NOBLOCK)
            if self._saved is not None and kind in ("start", "end"):
                self._keep(message)
        if kind not in ("heartbeat", "snapshot") and message.get("reason") != RESTART_REASON:
            for sink in self.sinks.values():
                sink.send(message)

    def announce(self, camera: str, classes: list[str], feed: str) -> None:
        """A camera's first request: the sinks' retained topics of it made at once, before
        any event (`classes`: those its models watch; `feed`: its feed's state)."""
        for sink in self.sinks.values():
            sink.announce(camera, classes, feed)

    def still_here(self, cameras: list[str]) -> None:
        """Every stats tick: the cameras this run serves (announced, not forgotten since), so
        that a calm camera, one without a message for days, is never taken for one gone."""
        for sink in self.sinks.values():
            sink.still_here(cameras)

    def _keep(self, message: Mapping[str, object]) -> None:
        """The open events on disk: a start's message added, an end's removed (written at
        once: a kill right after must find it)."""
        assert self._saved is not None
        key = str(message.get("id"))
        if message["kind"] == "start":
            self._opened[key] = dict(message)
        elif self._opened.pop(key, None) is None:
            return  # an end of nothing this run opened (a crashed run's)
        self._saved.save(self._opened, time.time())

    def close(self) -> None:
        """The sinks, then the socket (its linger lets the shutdown's ends go)."""
        for sink in self.sinks.values():
            sink.close()
        if self.connections is not None:
            self.connections.close()
        if self._pub is not None:
            self._pub.close()
            self._pub = None
        if self._saved is not None:
            self._saved.close()
        if self._ipc_path is not None:
            self._ipc_path.unlink(missing_ok=True)

    def stats(self) -> dict[str, object]:
        """`stats`' events_connections (with an events socket), events_SINK (each sink)."""
        out: dict[str, object] = {f"events_{name}": s.stats() for name, s in self.sinks.items()}
        if self.connections is not None:
            out["events_connections"] = {**self.connections.stats(),
                                         "subscribers_refused": self.refused_subscribers,
                                         "snapshots": self.snapshots.sent,
                                         "snapshots_deferred": self.snapshots.deferred}
        return out
