"""What the daemon says of each camera besides its replies, behind one object: skeleton
quality, feed health, action events (server/events.py: the rules) and where messages go
besides the log (server/event_publisher.py: the subscriber socket, heartbeats, snapshots,
MQTT). The request path tells it of each infer or push once, where it is decided (`frame` or
`refused`), and of each prediction (`observe`); the loop calls it every pass (`read`, `beat`),
sweep (`expire_silent`) and stats tick (`tick`); a camera reset, evicted, idle or met by a
fault is `forget`. A camera's first request to a model, where the rules are loaded, is
announced to the publisher's sinks (the classes the model watches for it, its feed's state):
an MQTT sink makes its retained topics at once, before any event. The rules load only where
a model has [models.events], the publisher only where events_endpoint or [events.mqtt] is
set: a daemon without events loads neither.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Dict, Protocol, Sequence

import numpy as np
import zmq

from stgcnd.log import get_logger
from stgcnd.server.cameras import CameraState
from stgcnd.server.config import Config, EventsConfig, ServerConfig
from stgcnd.server.connections import Connections
from stgcnd.server.curve_policy import KeyHandler
from stgcnd.server.executor import Reply
from stgcnd.server.feed_health import OK, FeedHealth, Gate
from stgcnd.server.models import ServedModel
from stgcnd.telemetry.skeleton_quality import SkeletonQuality

# The lines keep the module they were said by before the subsystem was one (a reader's filter).
log = get_logger("stgcnd.server.events")
stats_log = get_logger("stgcnd.server.server")

Event = Dict[str, object]
Watched = Dict[str, "tuple[EventsConfig, tuple[str, ...]]"]


class Rules(Protocol):
    """server/events.py's Events, as the hub uses it (its module loads only where watched)."""

    def configure(self, models: Watched, now: float, wall: float, gate: Gate | None = None
                  ) -> list[Event]: ...
    def observe_window(self, camera: str, model: str, probs: Sequence[float], now: float,
                       wall: float, window: np.ndarray, ts: float | None = None
                       ) -> list[Event]: ...
    def expire_silent(self, now: float, wall: float, cameras: Mapping[str, CameraState]
                      ) -> list[Event]: ...
    def forget(self, camera: str, now: float, wall: float, reason: str) -> list[Event]: ...
    def close_all(self, now: float, wall: float, reason: str) -> list[Event]: ...
    def snapshot(self, wall: float) -> list[Event]: ...
    def classes(self, camera: str, model: str) -> list[str]: ...


class Outlet(Protocol):
    """server/event_publisher.py's Publisher, as the hub uses it."""

    connections: Connections | None
    restart_ends: list[Event]

    @property
    def socket(self) -> zmq.Socket[bytes] | None: ...
    def read(self, now: float) -> bool: ...
    def beat(self, now: float, open_events: Callable[[float], list[Event]]
             ) -> list[Event]: ...
    def drop_revoked(self) -> None: ...
    def tidy(self, now: float) -> None: ...
    def send(self, message: Mapping[str, object]) -> None: ...
    def announce(self, camera: str, classes: list[str], feed: str) -> None: ...
    def still_here(self, cameras: list[str]) -> None: ...
    def close(self) -> None: ...
    def stats(self) -> dict[str, object]: ...


class EventHub:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], config: Config,
                 curve: KeyHandler | None = None, cap: int = 0) -> None:
        """`curve`, `cap`: the subscriber socket's CURVE and connection cap (Publisher)."""
        s = config.server
        self.quality = SkeletonQuality(s.visibility_threshold)
        self.health = FeedHealth()
        self.rules: Rules | None = None        # loaded by `configure`, where a model is watched
        self.publisher: Outlet | None = None
        if s.events_endpoint or config.events.mqtt is not None:  # restart keys: known now
            from stgcnd.server.event_publisher import Publisher
            self.publisher = Publisher(ctx, config, curve, cap)
        # Camera -> the models it was announced with (`observe`); a forgotten camera, and
        # every one after a reload (its watched classes may change), is announced again.
        self._announced: dict[str, set[str]] = {}
        self.run = os.urandom(8).hex()  # a restart is a new run: its seq starts again at 1
        self._seq = 0
        # Per request, the quality's own methods: no call of the hub's in between.
        self.frame: Callable[[str, np.ndarray], None] = self.quality.add
        self.refused: Callable[[str, bool, bool, bool], None] = self.quality.refused
        if self.publisher is not None:  # the events a crashed run left open: ended now
            self.emit(self.publisher.restart_ends)

    @property
    def socket(self) -> zmq.Socket[bytes] | None:
        return None if self.publisher is None else self.publisher.socket

    @property
    def connections(self) -> Connections | None:
        return None if self.publisher is None else self.publisher.connections

    def configure(self, models: Mapping[str, ServedModel], server: ServerConfig) -> None:
        """The rules of the models served (start, reload; after a policy-only reload their
        config and labels are the new ones): open events stay open under the new rules.
        `server`: its visibility_threshold and feed_enter gate the windows as the feed's
        health judges them, so that a feed said low-visibility or out-of-frame starts none."""
        watched = {name: (m.config.events, m.labels) for name, m in models.items()
                   if m.config.events is not None}
        if self.rules is None:
            if not watched:
                return
            from stgcnd.server.events import Events
            self.rules = Events()
        gate = Gate(server.visibility_threshold, server.feed_enter)
        self.emit(self.rules.configure(watched, time.monotonic(), time.time(), gate))
        self._announced.clear()

    def observe(self, reply: Reply, now: float) -> None:
        """A finished job: its prediction judged by the rules of its model, if watched."""
        if self.rules is None:
            return
        job = reply.job
        if self.publisher is not None and job.model not in self._announced.get(job.camera, ()):
            self._announce(job.camera, job.model)
        if reply.result is None:
            return
        self.emit(self.rules.observe_window(job.camera, job.model, reply.result["probs"], now,
                                            time.time(), job.window, job.ts))

    def _announce(self, camera: str, model: str) -> None:
        """`camera`'s first request to `model` (this run, since it was last forgotten)."""
        assert self.rules is not None and self.publisher is not None
        self._announced.setdefault(camera, set()).add(model)
        feed = self.health.states().get(camera, {}).get("state", OK)
        self.publisher.announce(camera, self.rules.classes(camera, model), str(feed))

    def forget(self, camera: str, reason: str) -> int:
        """`camera` reset, evicted, idle or met by a fault (`reason`): its open events end
        and its tracks go; how many ended."""
        self._announced.pop(camera, None)
        if self.rules is None:
            return 0
        ended = self.rules.forget(camera, time.monotonic(), time.time(), reason)
        self.emit(ended)
        return len(ended)

    def read(self, now: float) -> bool:
        """The subscriptions waiting; True when none was left (or there is no socket)."""
        return True if self.publisher is None else self.publisher.read(now)

    def beat(self, now: float) -> None:
        """Every loop pass: the snapshots due, the heartbeat."""
        if self.publisher is not None:
            rules = self.rules
            self.emit(self.publisher.beat(now, rules.snapshot if rules is not None
                                          else lambda _wall: []), logged=False)

    def expire_silent(self, now: float, cameras: Mapping[str, CameraState]) -> None:
        """The loop's frequent check (every CHECK_EVERY_S): cameras gone silent."""
        if self.rules is not None:
            self.emit(self.rules.expire_silent(now, time.time(), cameras))

    def tick(self, now: float, interval_s: float, cameras: list[str],
             config: ServerConfig) -> None:
        """Every stats interval: the subscribers' counts tidied and their budget held (first:
        a bug in a report must not skip them), then each camera's `skeleton_quality` line,
        and the feeds whose health changed with the quality lines that go with them (one
        state machine decides both; not for the shutdown's stub interval: `interval_s` under
        half of stats_interval)."""
        if self.publisher is not None:
            self.publisher.tidy(now)
            self.publisher.still_here(list(self._announced))
        records = self.quality.drain(cameras)
        for record in records:
            stats_log.info("skeleton_quality", **record)
        if interval_s >= config.stats_interval / 2:
            changes = self.health.update(records, time.time(), config)
            for note in self.health.notes:
                event = str(note.pop("event"))
                (stats_log.warning if event.endswith("_low") else stats_log.info)(event, **note)
            self.emit(changes)

    def drop_revoked(self) -> None:
        if self.publisher is not None:
            self.publisher.drop_revoked()

    def close(self) -> None:
        """End every open event (reason: shutdown), then close the publisher."""
        if self.rules is not None:
            self.emit(self.rules.close_all(time.monotonic(), time.time(), "shutdown"))
        if self.publisher is not None:
            self.publisher.close()

    def emit(self, events: list[Event], logged: bool = True) -> None:
        """Every message the daemon publishes goes through here: numbered, starts, updates
        and ends logged (`action_event`; not `logged`: a snapshot's copies), feeds' changes
        too (`feed_health`, at warning but for a recovery), then published (where a socket
        or a sink is)."""
        for event in events:
            self._seq += 1
            message = {**event, "seq": self._seq, "run": self.run}
            kind = event["kind"]
            if kind in ("start", "update", "end") and logged:
                log.info("action_event", **message)
            elif kind == "feed":
                (log.info if event["state"] == "ok" else log.warning)("feed_health", **message)
            if self.publisher is not None:
                self.publisher.send(message)

    def stats(self) -> dict[str, object]:
        """`stats`' events_SINK (each sink), feeds, events_connections (with a socket)."""
        out = {} if self.publisher is None else self.publisher.stats()
        connections = out.pop("events_connections", None)
        out["feeds"] = self.health.states()
        if connections is not None:
            out["events_connections"] = connections
        return out
