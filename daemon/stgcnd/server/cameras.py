"""Per-camera state, owned by the I/O loop alone: push rings (FrameRing), resend records,
clock, lane, activity; the `max_cameras` table, whose slots are shared by peer (peers.peer_key)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stgcnd.server.scheduler import Job

MIN_IDLE_S = 1.0     # a peer over its share replaces its own cameras quiet this long
EVICT_IDLE_S = 5.0   # otherwise, a full table gives up cameras quiet this long
SERVED_MEMORY = 4    # ids of served cameras remembered: this many times max_cameras
CHURN_PER_S = 1      # evictions a peer may cause per second: this many times max_cameras
FIRST_CAPACITY = 8   # frames; the buffer doubles up to the window as frames arrive


class FrameRing:
    """The last T frames (3, V, M) of one camera for one model, as a window (3, T, V, M).

    A prediction is due when the frame that fills the window arrives, then every `stride`
    frames. Frames before the window is full give no prediction (a zero-padded window would be
    a different input than the model was trained on).

    The buffer starts small and doubles while the window fills, so that a camera that sent a
    few frames holds kilobytes, not a whole window (59 KB per person at 150 frames).
    """

    def __init__(self, window_shape: tuple[int, int, int, int], stride: int = 1) -> None:
        c, t, v, m = window_shape
        self.shape = (c, t, v, m)
        self.frames = t
        self.stride = stride
        self._buf = np.zeros((min(FIRST_CAPACITY, t), c, v, m), dtype=np.float32)
        self.received = 0  # frames appended since creation or the last reset

    def append(self, frame: np.ndarray) -> bool:
        """Store one frame (3, V, M); True if a prediction is due for it."""
        received = self.received
        buf = self._buf
        if received == len(buf) < self.frames:  # still filling: grow, frames stay in order
            grown = np.empty((min(2 * len(buf), self.frames), *buf.shape[1:]), np.float32)
            grown[:received] = buf
            self._buf = buf = grown
        buf[received % self.frames] = frame
        self.received = received = received + 1
        if received < self.frames:
            return False
        return (received - self.frames) % self.stride == 0

    @property
    def buffered(self) -> int:
        return min(self.received, self.frames)

    @property
    def nbytes(self) -> int:
        return self._buf.nbytes

    def window(self) -> np.ndarray:
        """The last T frames, oldest first, as a contiguous (3, T, V, M) float32 window;
        only once the window is full (`append` said a prediction is due)."""
        if self.received < self.frames:
            raise ValueError(f"the window holds {self.received} of {self.frames} frames")
        start = self.received % self.frames
        ordered = np.concatenate((self._buf[start:], self._buf[:start])) if start else self._buf
        return np.ascontiguousarray(ordered.transpose(1, 0, 2, 3))

    def reset(self) -> None:
        self._buf = np.zeros((min(FIRST_CAPACITY, self.frames), *self._buf.shape[1:]),
                             np.float32)
        self.received = 0


MAX_WAITING = 4      # resends of one request answered when it is (the client's 3 retries)


@dataclass
class Sent:
    """The last infer, and the last push, of one camera for one model (CameraState.sent), so
    that a resend (the same id, after a client timeout) makes no second prediction: the
    events see each window once. One record for both, answered the one way
    (RequestPath._answer): a resent push never appends its frame again.

    A successful answer is kept in `reply` and sent again as it is (a push that made no
    prediction due has it at once); while the prediction is queued or running (`job`), a
    resend waits for its answer (`waiting`: the latest MAX_WAITING resends' routing ids);
    after an error reply a resend runs `window` again. An infer's `window` also tells a resend
    from a new window sent with a reused id (which is a new request).
    """

    req_id: int
    extra: dict[str, Any]                 # push: model / ready / frames / seq for its reply
    window: np.ndarray | None = None      # the window to predict on, when one was due
    reply: list[bytes] | None = None      # the final answer, once there is one
    job: Job | None = None                # the prediction queued or running
    waiting: Sequence[bytes] = ()         # replaced whole, never appended to: no list made


@dataclass
class CameraState:
    name: str
    lane: int
    last_activity: float
    peer: str = ""
    in_flight: int = 0                    # jobs submitted and not yet answered
    served: bool = False                  # a prediction answered ok, here or before
    requests: int = 0
    rings: dict[str, FrameRing] = field(default_factory=dict)
    sent: dict[tuple[str, str], Sent] = field(default_factory=dict)  # (op, model) -> its last
    ts: float | None = None               # the latest `ts` (docs/protocol.md): its clock
    untimed: bool = False                 # an infer or push without ts: never on a ts clock
    # model -> when (the request's `received`) its last infer or push passed min_interval_ms
    let_through: dict[str, float] = field(default_factory=dict)

    def ring(self, model: str, window_shape: tuple[int, ...], stride: int) -> FrameRing:
        ring = self.rings.get(model)
        if ring is None or ring.shape != tuple(window_shape) or ring.stride != stride:
            # New, or the model was reloaded with another shape or stride: start over.
            ring = self.rings[model] = FrameRing(window_shape, stride)  # type: ignore[arg-type]
            self.sent.pop(("push", model), None)
        return ring

    def reset(self, models: list[str]) -> None:
        """Push state and resend records; a clock (ts) starts over."""
        for name in models:
            self.rings.pop(name, None)
            self.sent.pop(("push", name), None)
            self.sent.pop(("infer", name), None)
        self.ts = None


@dataclass(frozen=True)
class Eviction:
    camera: str
    peer: str
    idle_s: float
    rule: str          # "own-share", "over-share", "idle" or "unserved"


# Who gives way to whom when the table is full (docs/hardening.md, "Camera slots", says it in
# full): 1. the least recently active camera quiet for EVICT_IDLE_S; 2. else, if its peer holds
# its share already, one of that peer's own cameras quiet for MIN_IDLE_S; 3. else the least
# recently active camera of a peer over its share, the biggest first. Never-served cameras hold
# at most max_cameras - reserve slots and take only each other's beyond that; a served camera
# coming back takes a free slot, else a never-served one's. At most CHURN_PER_S x max_cameras
# evictions a second per peer; a camera with a request in flight is never taken.
class CameraTable:
    def __init__(self, max_cameras: int, reserve: int | None = None) -> None:
        self.max_cameras = max_cameras
        # Slots only served cameras can take (none in a table of one: nothing could start).
        self.reserve = min(max(1, max_cameras // 8), max_cameras - 1) if reserve is None \
            else reserve
        # All three in activity order, least recent first (move_to_end on every request).
        self.cameras: OrderedDict[str, CameraState] = OrderedDict()
        self._by_peer: dict[str, OrderedDict[str, CameraState]] = {}
        self._unserved: OrderedDict[str, CameraState] = OrderedDict()
        # Ids of served cameras, in and out of the table -> the peer served; least recent first
        self.served: OrderedDict[str, str] = OrderedDict()
        self._churn: dict[str, list[float]] = {}  # peer -> [second it counts from, evictions]
        self._free_lanes = list(range(max_cameras - 1, -1, -1))
        self.evictions = 0
        self.churn_refused = 0   # new cameras refused because their peer churned too fast

    def get(self, name: str, now: float, peer: str = "") -> tuple[CameraState | None,
                                                                  Eviction | None]:
        """The camera's state, created on first sight (taking a slot as the comment above the
        class says), and the eviction that made room, if any; (None, None): no slot."""
        cam = self.cameras.get(name)
        if cam is not None:
            cam.last_activity = now
            self.cameras.move_to_end(name)
            if cam.peer != peer:
                self._unlink(cam)
                cam.peer = peer
                self._link(cam)
            else:
                self._by_peer[peer].move_to_end(name)
            if not cam.served:
                self._unserved.move_to_end(name)
            return cam, None
        served = name in self.served
        evicted = None
        if not self._free_lanes or (
                not served and len(self._unserved) >= self.max_cameras - self.reserve):
            evicted = self._make_room(peer, now, served)
            if evicted is None:
                return None, None
        cam = CameraState(name, self._free_lanes.pop(), now, peer, served=served)
        self.cameras[name] = cam
        self._link(cam)
        if served:
            self.served.move_to_end(name)
        else:
            self._unserved[name] = cam
        return cam, evicted

    def mark_served(self, cam: CameraState) -> None:
        """One of the camera's predictions was answered ok (RequestPath.complete)."""
        if cam.served or self.cameras.get(cam.name) is not cam:
            return
        cam.served = True
        del self._unserved[cam.name]
        self._remember(cam.name, cam.peer)

    def reclaim_idle(self, now: float, idle_timeout: float) -> list[tuple[str, float]]:
        """Forget cameras idle for idle_timeout with nothing in flight; (name, idle seconds)."""
        gone = []
        for cam in list(self.cameras.values()):  # least recent first: stop at the first young
            idle = now - cam.last_activity
            if idle <= idle_timeout:
                break
            if cam.in_flight == 0:
                self._remove(cam)
                gone.append((cam.name, idle))
        return gone

    def __len__(self) -> int:
        return len(self.cameras)

    # -- inside ------------------------------------------------------------------------------
    def _make_room(self, peer: str, now: float, served: bool) -> Eviction | None:
        churn = self._churn.get(peer)
        if churn is not None and now - churn[0] < 1.0 and \
                churn[1] >= CHURN_PER_S * self.max_cameras:
            self.churn_refused += 1
            return None
        if served:  # the table is full (a served camera takes a free lane)
            victim, rule = _least_recent(self._unserved, now), "unserved"
            if victim is None:
                victim, rule = self._by_rules(peer, now, unserved_only=False)
        else:
            # Below its cap, a never-served camera may take any camera's long idle slot;
            # else only another never-served camera gives way.
            victim, rule = None, "idle"
            if not self._free_lanes and \
                    len(self._unserved) < self.max_cameras - self.reserve:
                victim = _least_recent(self.cameras, now - EVICT_IDLE_S)
            if victim is None:
                victim, rule = self._by_rules(peer, now, unserved_only=True)
        if victim is None:
            return None
        self._remove(victim)
        self.evictions += 1
        if churn is None or now - churn[0] >= 1.0:
            if len(self._churn) >= 4 * self.max_cameras:  # bounded: forget past seconds
                self._churn = {p: c for p, c in self._churn.items() if now - c[0] < 1.0}
            self._churn[peer] = [now, 1]
        else:
            churn[1] += 1
        return Eviction(victim.name, victim.peer, round(now - victim.last_activity, 3), rule)

    def _by_rules(self, peer: str, now: float, unserved_only: bool
                  ) -> tuple[CameraState | None, str]:
        """Rules 1-3 of the comment above CameraTable, among the never-served cameras only if
        `unserved_only`; a peer's share counts all of its cameras."""
        victim = _least_recent(self._unserved if unserved_only else self.cameras,
                               now - EVICT_IDLE_S)
        if victim is not None:
            return victim, "idle"
        held = self._by_peer.get(peer)
        mine = len(held) if held else 0
        share = -(-self.max_cameras // (len(self._by_peer) + (0 if mine else 1)))
        if held and mine >= share:
            return _least_recent(held, now - MIN_IDLE_S, unserved_only), "own-share"
        for cams in sorted(self._by_peer.values(), key=len, reverse=True):
            if len(cams) <= share:
                break
            victim = _least_recent(cams, now, unserved_only)
            if victim is not None:
                return victim, "over-share"
        return None, "over-share"

    def _remove(self, cam: CameraState) -> None:
        del self.cameras[cam.name]
        self._unlink(cam)
        self._free_lanes.append(cam.lane)
        if cam.served:  # remembered from its last activity
            self._remember(cam.name, cam.peer)
        else:
            del self._unserved[cam.name]

    def _remember(self, name: str, peer: str) -> None:
        served = self.served
        served[name] = peer
        served.move_to_end(name)
        if len(served) > SERVED_MEMORY * self.max_cameras:
            served.popitem(last=False)

    def _link(self, cam: CameraState) -> None:
        self._by_peer.setdefault(cam.peer, OrderedDict())[cam.name] = cam

    def _unlink(self, cam: CameraState) -> None:
        cams = self._by_peer[cam.peer]
        del cams[cam.name]
        if not cams:
            del self._by_peer[cam.peer]


def _least_recent(cams: OrderedDict[str, CameraState], quiet_before: float,
                  unserved_only: bool = False) -> CameraState | None:
    """The least recently active camera with nothing in flight (never served, if
    `unserved_only`), if it was last active at or before `quiet_before`."""
    for cam in cams.values():
        if cam.last_activity > quiet_before:
            return None  # activity order: every later one is younger still
        if cam.in_flight == 0 and not (unserved_only and cam.served):
            return cam
    return None
