"""The events feed on an MQTT broker ([events.mqtt]; docs/protocol.md, "Events over MQTT").

Every message the feed publishes goes to PREFIX/CAMERA/event (QoS 1 by default) with an
`mqtt_id` (RUN-N: this start, in ms, and a number that grows by one a message), and the
camera's state (its open events, its last message) to PREFIX/CAMERA/state, retained; and
whether the daemon runs to PREFIX/status, retained: `online` after connecting, `offline` at a
clean stop and, as the will the broker sends when the connection is lost, at a crash.
After each state, the plain topics made from it (server/mqtt_topics.py: PREFIX/CAMERA/class/
CLASS ON/OFF, PREFIX/CAMERA/feed, Home Assistant's discovery configs), those that changed.
A camera's first request (`announce`, from server/event_hub.py) makes its state before any
message: every class its models watch (OFF) and its feed's state, so that a site has every
entity at once.

At every start and every connection without a session (a broker that lost it) the pump waits
while the sink reads back the retained states, class topics and this node's discovery configs
(server/mqtt_retained.py ends what a crashed run left open and removes cameras long gone,
with every class topic the broker keeps of them; discovery off withdraws the configs an
earlier run published), then every state of this run goes again: what the broker retains is
true again within a round trip of connecting.

Nothing here waits on the broker in the I/O loop: `send` encodes, appends to a bounded buffer
and notifies. A pump thread hands the buffer to paho only while connected and at most
IN_FLIGHT unacknowledged at a time (so that paho's own queue, which refuses the newest when
full, never fills), and paho's thread does the network. paho keeps what it was handed until
the broker acknowledges it, across reconnects (clean_session off), and resends it flagged DUP:
at least once, so a subscriber drops an `mqtt_id` it has seen. A broker away for longer than
the buffer lasts loses the oldest messages, counted (`dropped`) and said once an outage.
"""

from __future__ import annotations

import collections
import json
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from stgcnd.errors import UserError
from stgcnd.log import get_logger
from stgcnd.server.config import MqttConfig
from stgcnd.server.mqtt_errors import REASONS, why_dropped, why_failed, why_refused
from stgcnd.server.mqtt_retained import State, heard_of, reconcile, with_class_topics
from stgcnd.server.mqtt_topics import Discovery, classes_of, level_name, plain_topics, topic_level
from stgcnd.threadname import name_os_thread

log = get_logger(__name__)

IN_FLIGHT = 20       # messages handed to paho and not yet acknowledged (paho's default window)
KEEPALIVE_S = 30     # a broker silent this long is taken for gone: reconnect
FLUSH_S = 2.0        # at shutdown, how long the last messages may take to be acknowledged
STOP_S = 1.0         # ... and paho's thread to stop (it may be in a connect attempt)
STATUS_S = 1.0       # ... and `offline` on the status topic to be acknowledged
SYNC_S = 5.0         # the most the retained states may take to come back (then: go on)
FORGET_CHECK_S = 60.0  # how often this run's states of cameras gone are looked for
RECONNECT_S = (1, 30)  # paho's wait before reconnecting: the first, doubled up to the second
ONLINE, OFFLINE = b"online", b"offline"  # Home Assistant's availability payloads, as they are
__all__ = ["MqttSink", "topic_level"]


class MqttSink:
    """One broker connection: `send` from the I/O loop, `close` at shutdown."""

    def __init__(self, config: MqttConfig) -> None:
        host, port, tls = config.address
        self._tls = tls
        self.prefix, self.qos = config.topic_prefix, config.qos
        self.status_topic = f"{self.prefix}/status"
        self._forget_s = config.forget_after_s
        self._run = round(time.time() * 1e3)
        self._seq = 0
        self._open: dict[str, dict[str, object]] = {}  # camera -> its open events by id
        self._cond = threading.Condition()
        self._buffer: collections.deque[tuple[str, bytes]] = collections.deque()
        # State topic -> the camera's latest state, not yet handed over (the pump encodes it:
        # a broker away for a while costs one encoding a camera, and none on the I/O loop);
        # None: the topic is to be removed (an empty retained message).
        self._states: dict[str, State | None] = {}
        self._latest: dict[str, State] = {}  # every state of this run: sent again at a sync
        # A sync (a connection without a session): the pump waits while the retained states
        # come back into _retained, until this client's own `online` comes back after them.
        self._syncing = self._synced = self._ever_synced = False
        self._sync_began, self._sync_mid = 0.0, -1
        self._retained: dict[str, State] = {}
        self._retained_classes: dict[str, set[str]] = {}  # state topic -> its class topics'
        self._retained_configs: set[str] = set()  # this node's discovery configs
        # The plain topics (server/mqtt_topics.py) to hand over, retained, and those handed
        # over this connection by state topic: only what changed goes (all after a sync).
        self._plain: collections.deque[tuple[str, bytes]] = collections.deque()
        self._published: dict[str, dict[str, bytes]] = {}
        self._next_forget = 0.0
        self._said_seen: dict[str, float] = {}  # state topic -> when its `seen` last went out
        self._cap = config.buffer
        self._in_flight = 0
        self._connected = self._stopped = self._warned = False
        # Why connecting fails, said once a change (None: connected, or not failed yet), since
        # when and how many attempts: the recovery line says them.
        self._why: str | None = None
        self._failing_since, self._failures = 0.0, 0
        self.counts = {"delivered": 0, "dropped": 0, "connects": 0}
        client_id = config.client_id or f"stgcnd-{socket.gethostname()}"
        # A camera gone has its discovery configs removed even where discovery is now off.
        self._any_discovery = Discovery(config.discovery_prefix, client_id, self.status_topic)
        self._discovery = self._any_discovery if config.discovery else None
        # What a sync reads back (the states first: without them nothing can be made true).
        self._sync_filters = [f"{self.prefix}/+/state", f"{self.prefix}/+/class/+",
                              self._any_discovery.filter, self.status_topic]
        client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311,
                             client_id=client_id, clean_session=False)  # a session kept
        client.max_inflight_messages_set(IN_FLIGHT)
        # Set before connecting: the broker publishes it when it loses the connection unasked.
        client.will_set(self.status_topic, OFFLINE, qos=1, retain=True)
        client.reconnect_delay_set(*RECONNECT_S)
        try:
            if config.username:
                password = (Path(config.password_file).read_text().splitlines() or [""])[0] \
                    if config.password_file else None
                client.username_pw_set(config.username, password)
            if tls:
                client.tls_set(ca_certs=config.ca_file, certfile=config.cert_file,
                               keyfile=config.key_file)
        except (OSError, ValueError) as exc:  # an unreadable password, a bad certificate
            raise UserError(f"[events.mqtt]: {exc}; fix the file or its permissions") from None
        client.on_connect, client.on_disconnect = self._on_connect, self._on_disconnect
        client.on_publish, client.on_connect_fail = self._on_publish, self._on_connect_fail
        client.on_subscribe, client.on_message = self._on_subscribe, self._on_message
        self._client = client  # before connecting: the callbacks publish through it
        client.connect_async(host, port, KEEPALIVE_S)  # paho's thread connects, and retries
        client.loop_start()
        self._pump = threading.Thread(target=self._hand_over, name="mqtt-pump", daemon=True)
        self._pump.start()
        log.info("mqtt_sink", broker=config.broker, client_id=client_id,
                 topics=f"{self.prefix}/CAMERA/event, {self.prefix}/CAMERA/state, "
                        f"{self.prefix}/CAMERA/class/CLASS, {self.prefix}/CAMERA/feed, "
                        f"{self.status_topic}",
                 discovery=config.discovery_prefix if config.discovery else "off",
                 qos=self.qos, buffer=self._cap)

    def send(self, message: Mapping[str, object]) -> None:
        """One message of the feed (the I/O loop): never waits for the broker."""
        camera = message.get("camera")
        with self._cond:  # the number and the states are a sync's too (paho's thread)
            body = self._numbered(message)
            level, state = "", None
            if isinstance(camera, str) and camera:
                level = f"/{topic_level(camera)}"
                state = self._state(camera, f"{self.prefix}{level}/state", body)
            if len(self._buffer) >= self._cap:
                self._buffer.popleft()
                self.counts["dropped"] += 1
                if not self._warned:
                    self._warned = True
                    log.warning("mqtt_buffer_full", buffer=self._cap,
                                action="dropping the oldest messages until the broker is back "
                                       "(counted in stats: events_mqtt.dropped)")
            self._buffer.append((f"{self.prefix}{level}/event", _json(body)))
            if state is not None:
                self._states[f"{self.prefix}{level}/state"] = state
                self._latest[f"{self.prefix}{level}/state"] = state
            if self._forget_s and time.time() >= self._next_forget:
                self._forget_gone(time.time())
            if self._connected and self._in_flight < IN_FLIGHT:  # else the pump can't send
                self._cond.notify()

    def announce(self, camera: str, classes: list[str], feed: str) -> None:
        """`camera` made its first request (the I/O loop; server/event_hub.py): its state
        gets `classes` (the ones its models watch: their topics say OFF until an event)
        and, where it has none yet, `feed` (the state its feed's health holds), at once,
        with `seen` (now) for the forgetting. A camera known with these already: nothing."""
        topic = f"{self.prefix}/{topic_level(camera)}/state"
        with self._cond:
            before = self._latest.get(topic)
            known = classes_of(before) if before is not None else []
            merged = sorted({*known, *classes})
            if before is not None and merged == known and before.get("feed") is not None:
                return
            state: State = {"camera": camera, "open": [], "last": None, **(before or {}),
                            "classes": merged, "seen": round(time.time(), 3)}
            if state.get("feed") is None:
                state["feed"] = feed
            self._states[topic] = self._latest[topic] = state
            if self._connected and self._in_flight < IN_FLIGHT:
                self._cond.notify()

    def still_here(self, cameras: list[str]) -> None:
        """The cameras this run serves now (the stats tick; server/event_hub.py): each one's
        `seen` is now, in memory (so `_forget_gone` keeps it), and on the broker once its
        retained copy is half of forget_after_s old (so a sync after a restart keeps it too:
        a calm camera's Home Assistant entities never vanish). Those not listed are left to
        age from their last sign of life."""
        if not self._forget_s:
            return
        now = time.time()
        with self._cond:
            for camera in cameras:
                topic = f"{self.prefix}/{topic_level(camera)}/state"
                state = self._latest.get(topic)
                if state is None:
                    continue
                said = self._said_seen.get(topic)
                # A new dict: the pump may be serializing the one it replaces.
                state = self._latest[topic] = {**state, "seen": round(now, 3)}
                if said is None or now - said > self._forget_s / 2:
                    self._said_seen[topic] = now
                    self._states[topic] = state
            if self._connected and self._in_flight < IN_FLIGHT:
                self._cond.notify()

    def _forget_gone(self, now: float) -> None:
        """(Lock held.) The states of cameras quiet for forget_after_s with nothing open leave
        memory, so that camera ids that come and go cost nothing for ever (the broker keeps
        their retained state until a sync finds it that old)."""
        self._next_forget = now + FORGET_CHECK_S
        for topic, state in list(self._latest.items()):
            heard = heard_of(state)
            if not state["open"] and heard is not None and now - heard > self._forget_s:
                del self._latest[topic]
                self._published.pop(topic, None)
                self._said_seen.pop(topic, None)

    def _numbered(self, message: Mapping[str, object]) -> State:
        self._seq += 1
        return {**message, "mqtt_id": f"{self._run}-{self._seq}"}

    def _state(self, camera: str, topic: str, body: dict[str, object]) -> dict[str, object]:
        """The camera's retained state: its open events (their start messages), its last
        message, whatever its kind, the classes it has had events of and its feed's state
        (what its plain topics are made from: server/mqtt_topics.py)."""
        events = self._open.setdefault(camera, {})
        kind, cls = body.get("kind"), body.get("class")
        if kind == "start":
            events[str(body.get("id"))] = body
        elif kind == "end":
            events.pop(str(body.get("id")), None)
        if not events:
            del self._open[camera]  # a camera's entry lives while it has an open event
        before = self._latest.get(topic, {})
        classes = before.get("classes", [])
        assert isinstance(classes, list)
        if kind in ("start", "end") and isinstance(cls, str) and cls not in classes:
            classes = sorted([*classes, cls])
        state: State = {"camera": camera, "open": list(events.values()), "last": body,
                        "classes": classes,
                        "feed": body.get("state") if kind == "feed" else before.get("feed")}
        if "seen" in before:  # announced: kept for the forgetting (mqtt_retained.heard_of)
            state["seen"] = before["seen"]
        return state

    def stats(self) -> dict[str, object]:
        with self._cond:
            return {"connected": self._connected, "in_flight": self._in_flight,
                    "buffered": len(self._buffer) + len(self._states) + len(self._plain),
                    **self.counts}

    def close(self, flush_s: float = FLUSH_S) -> None:
        """Give the last messages (the shutdown's end events) `flush_s` to be acknowledged
        where the broker is there, then disconnect; what is left is said."""
        with self._cond:
            self._cond.wait_for(lambda: not self._connected or not (
                self._buffer or self._states or self._plain or self._in_flight),
                timeout=flush_s)
            self._stopped = True
            left = len(self._buffer) + self._in_flight
            self._cond.notify_all()
        if left:
            log.warning("mqtt_unsent", messages=left, connected=self._connected,
                        reason="the daemon stopped before the broker acknowledged them")
        if self._connected:  # a clean disconnect discards the will: `offline` is said here
            info = self._publish_status(OFFLINE)
            try:
                if info is not None:
                    info.wait_for_publish(STATUS_S)
            except (ValueError, RuntimeError) as exc:
                log.warning("mqtt_offline_unsent", error=str(exc))
        self._client.disconnect()
        # loop_stop joins paho's thread, which may be inside a connect attempt (seconds, to
        # an address that drops packets): waited for STOP_S at most (it is a daemon thread).
        stopper = threading.Thread(target=self._client.loop_stop, daemon=True)
        stopper.start()
        stopper.join(STOP_S)
        self._pump.join(STOP_S)

    # -- the pump thread, and paho's thread's callbacks ------------------------------------
    def _hand_over(self) -> None:
        name_os_thread("stgcnd-mqtt")
        while True:
            with self._cond:
                ready = self._cond.wait_for(lambda: self._stopped or (
                    self._connected and self._synced and self._in_flight < IN_FLIGHT and
                    bool(self._buffer or self._states or self._plain)), timeout=SYNC_S / 5)
                if self._stopped:
                    return
                # (a connection lost in a sync: the next connection syncs again)
                late = self._syncing and self._connected and \
                    time.monotonic() - self._sync_began > SYNC_S
            if not ready:
                if late:  # the broker never sent `online` back: go on with what came
                    log.warning("mqtt_retained_late", waited_s=SYNC_S,
                                action="going on with the retained states read so far")
                    self._end_sync()
                continue
            with self._cond:
                state: State | None = None
                retain, is_state = not self._buffer, not (self._buffer or self._plain)
                if self._buffer:
                    topic, payload = self._buffer.popleft()
                elif self._plain:  # a state's plain topics before the next state
                    topic, payload = self._plain.popleft()
                else:  # the states after the events: each one the camera's latest
                    topic = next(iter(self._states))
                    state = self._states.pop(topic)
                self._in_flight += 1
            # Outside the lock: paho calls _on_publish holding its own lock, so holding ours
            # here would invert the order. paho keeps a message handed to it while offline.
            try:
                if is_state:  # None: an empty retained message removes the topic
                    payload = b"" if state is None else _json(state)
                    if state is not None:
                        self._queue_plain(topic, state)
                info = self._client.publish(topic, payload, self.qos, retain=retain)
                gone = self.qos == 0 and info.rc != mqtt.MQTT_ERR_SUCCESS  # QoS 0 offline
            except Exception as exc:  # one message lost, never the pump thread
                log.error("mqtt_publish_failed", topic=topic, error=repr(exc))
                gone = True
            if gone:
                with self._cond:
                    self._in_flight -= 1
                    self.counts["dropped"] += 1

    def _queue_plain(self, topic: str, state: State) -> None:
        """The plain topics of `state` (published on `topic`) that changed since this
        connection handed them over, queued after it."""
        made = plain_topics(topic[:-len("/state")], state, self._discovery)
        with self._cond:
            before = self._published.get(topic, {})
            self._plain.extend((t, p) for t, p in made.items() if before.get(t) != p)
            self._published[topic] = made

    def _on_connect(self, client: mqtt.Client, userdata: object, flags: mqtt.ConnectFlags,
                    reason: mqtt.ReasonCode, properties: mqtt.Properties | None) -> None:
        if reason.is_failure:
            self._failed(why_refused(reason), f"CONNACK: {reason}")
            return
        self._recovered()
        # Without a session (and at every start: a crashed run's session may be there) what
        # the broker retains may lie: the pump waits while it is read back and made true.
        sync = not (self._ever_synced and flags.session_present)
        with self._cond:
            self._connected, self._warned = True, False
            self._synced, self._syncing = not sync, sync
            self._sync_began, self._retained = time.monotonic(), {}
            self._retained_classes, self._retained_configs = {}, set()
            self.counts["connects"] += 1
            self._cond.notify_all()
        log.info("mqtt_connected", session_present=flags.session_present,
                 buffered=len(self._buffer), in_flight=self._in_flight)
        if sync:  # the retained states come after the SUBACK, before what is published after
            self._sync_mid = client.subscribe([(f, 1) for f in self._sync_filters])[1] or -1
        else:
            self._publish_status(ONLINE)

    def _on_subscribe(self, client: mqtt.Client, userdata: object, mid: int,
                      reasons: list[mqtt.ReasonCode], properties: mqtt.Properties | None,
                      ) -> None:
        if mid != self._sync_mid:
            return
        self._publish_status(ONLINE)  # its echo comes after the retained states
        refused = {f: str(r) for f, r in zip(self._sync_filters, reasons) if r.is_failure}
        if refused:  # an ACL: what it keeps from coming back cannot be made true
            log.warning("mqtt_retained_unread",
                        reason=", ".join(f"{f}: {r}" for f, r in refused.items()),
                        action="allow this client to subscribe to " +
                               ", ".join(self._sync_filters) + ", or a crashed run's open "
                               "events stay retained as open, a camera gone may keep class "
                               "topics, discovery turned off may leave its configs")
        if self._sync_filters[0] in refused or self.status_topic in refused:
            self._end_sync()  # no states (or no `online` echo to end the sync): go on

    def _on_message(self, client: mqtt.Client, userdata: object,
                    msg: mqtt.MQTTMessage) -> None:
        if not self._syncing:
            return  # a subscription left over in a session from a run killed in its sync
        if msg.topic == self.status_topic:
            if not msg.retain and msg.payload == ONLINE:  # ours: every retained one came
                self._end_sync()
            return
        if not (msg.retain and msg.payload):
            return
        if self._any_discovery.is_mine(msg.topic):
            with self._cond:
                self._retained_configs.add(msg.topic)
            return
        # PREFIX/LEVEL/state or PREFIX/LEVEL/class/CLASS (a level never holds a /)
        parts = msg.topic[len(self.prefix) + 1:].split("/")
        state_topic = f"{self.prefix}/{parts[0]}/state"
        if len(parts) == 3 and parts[1] == "class":
            with self._cond:
                self._retained_classes.setdefault(state_topic, set()).add(
                    level_name(parts[2]))
            return
        try:
            state = json.loads(msg.payload)
        except ValueError:
            return  # not a state this daemon wrote: left alone
        if isinstance(state, dict) and len(parts) == 2:
            with self._cond:
                self._retained[msg.topic] = state

    def _end_sync(self) -> None:
        """The retained states read back: the ends of what a crashed run left open and the
        states to remove go, then every state of this run again; the pump goes on."""
        now = time.time()
        with self._cond:
            if not self._syncing:
                return
            open_now = {topic: {str(e["id"]) for e in state["open"] if isinstance(e, dict)}
                        for topic, state in self._latest.items()
                        if isinstance(state["open"], list)}
            # A state written after this daemon forgot the camera may lack classes whose
            # topics the broker keeps: the class topics read back count as its classes.
            self._retained = with_class_topics(self._retained, self._retained_classes)
            ends, states = reconcile(self._retained, open_now, set(self._latest), now,
                                     self._forget_s)
            for topic, state in self._latest.items():  # a crashed run's classes go OFF
                kept = self._retained.get(topic)
                classes = sorted({*classes_of(state), *(classes_of(kept) if kept else [])})
                if kept is not None and classes != state.get("classes"):
                    self._latest[topic] = {**state, "classes": classes}
            removed: dict[str, bytes] = {}  # topic -> b"" (one removal each)
            for topic, gone in states.items():  # a camera gone: its plain topics too (its
                if gone is None and topic in self._retained:  # feed's, though unsaid)
                    removed.update((t, b"") for t in plain_topics(
                        topic[:-len("/state")], {**self._retained[topic], "feed": ""},
                        self._any_discovery))
            if self._discovery is None:  # turned off: an earlier run's configs withdrawn
                removed.update((t, b"") for t in sorted(self._retained_configs))
            self._plain.extend(removed.items())
            self._published = {}  # the broker may have lost them: every one goes again
            for topic, end in ends:  # after what waits: the buffer keeps the feed's order
                self._buffer.append((topic, _json(self._numbered(end))))
            self._states.update(states)
            self._states.update(self._latest)
            self._syncing, self._synced, self._ever_synced = False, True, True
            self._retained, republished = {}, len(self._latest)
            withdrawn = len(self._retained_configs) if self._discovery is None else 0
            self._retained_classes, self._retained_configs = {}, set()
            self._cond.notify_all()
        self._client.unsubscribe(self._sync_filters)
        log.info("mqtt_retained_checked", ended=len(ends),
                 removed=sum(1 for s in states.values() if s is None), republished=republished,
                 discovery_withdrawn=withdrawn)

    def _publish_status(self, payload: bytes) -> mqtt.MQTTMessageInfo | None:
        with self._cond:
            self._in_flight += 1  # acknowledged through _on_publish like the feed's
        try:
            return self._client.publish(self.status_topic, payload, 1, retain=True)
        except Exception as exc:  # never the callback's thread
            log.error("mqtt_publish_failed", topic=self.status_topic, error=repr(exc))
            with self._cond:
                self._in_flight -= 1
            return None

    def _on_disconnect(self, client: mqtt.Client, userdata: object,
                       flags: mqtt.DisconnectFlags, reason: mqtt.ReasonCode,
                       properties: mqtt.Properties | None) -> None:
        with self._cond:
            was, self._connected = self._connected, False
            self._cond.notify_all()
        if was and not self._stopped:
            log.warning("mqtt_disconnected", reason=str(reason),
                        action="buffering; reconnecting (1 to 30 s apart)")
        elif not was and not self._stopped:  # an attempt that got no CONNACK
            why = why_dropped(reason)
            if why is not None:
                self._failed(why, f"no CONNACK: {reason}")

    def _on_connect_fail(self, client: mqtt.Client, userdata: object) -> None:
        # paho calls this inside its `except OSError:` around the attempt (loop_forever), and
        # passes no error: the one being handled is the attempt's.
        exc = sys.exc_info()[1]
        self._failed(why_failed(exc, self._tls), str(exc) if exc is not None else "")

    def _failed(self, why: str, error: str) -> None:
        """(paho's thread) A connection attempt failed: said when the reason changes."""
        if self._why is None:
            self._failing_since, self._failures = time.monotonic(), 0
        self._failures += 1
        if why != self._why:
            self._why = why
            log.warning("mqtt_unreachable", reason=why, error=error, fix=REASONS[why],
                        action="buffering; retrying (1 to 30 s apart), said again when the "
                               "reason changes")

    def _recovered(self) -> None:
        if self._why is not None:
            log.info("mqtt_recovered", reason=self._why, failed_attempts=self._failures,
                     unreachable_s=round(time.monotonic() - self._failing_since, 1))
            self._why = None

    def _on_publish(self, client: mqtt.Client, userdata: object, mid: int,
                    reason: mqtt.ReasonCode, properties: mqtt.Properties | None) -> None:
        with self._cond:
            self._in_flight -= 1
            self.counts["delivered"] += 1
            self._cond.notify_all()


def _json(body: Mapping[str, object]) -> bytes:
    return json.dumps(body, separators=(",", ":"), default=str).encode()
