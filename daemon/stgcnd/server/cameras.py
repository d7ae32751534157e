"""Per-camera state, owned by the I/O loop alone: push rings, resend records, lane, activity.

A camera costs no thread and nothing on the device: joining takes a free lane index (each
executor prepared one CUDA stream and pinned rows per lane before READY) and a few Python
objects; its push ring grows with the frames it sends (kilobytes for a camera that sent a few).

`max_cameras` bounds the table, and camera ids are the client's to invent, so slots are shared
by *peer* (the process of an ipc client, the address of a tcp one: connections.peer_key),
never by camera id. When the table is full, a new camera takes the slot of:

1. the least recently active camera quiet for EVICT_IDLE_S, whoever holds it;
2. else, if its peer already holds its share (max_cameras / peers, rounded up): one of that
   peer's own cameras quiet for MIN_IDLE_S; a peer inventing ids churns its own slots only;
3. else the least recently active camera of a peer holding more than its share, the biggest
   first (a client that filled the table gives way to a newcomer at once).

A camera with a request in flight is never taken. No slot: the request is answered `busy`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stgcnd.server.ring import FrameRing

MIN_IDLE_S = 1.0     # a peer over its share replaces its own cameras quiet this long
EVICT_IDLE_S = 5.0   # otherwise, a full table gives up cameras quiet this long


@dataclass
class PushRecord:
    """The last push of one camera for one model, for resends after a client timeout.

    A resent id never appends its frame again. If the frame made a prediction due, `window`
    keeps that window, so a resend after `expired`, `busy` or a lost reply runs it again; a
    successful answer is kept in `reply` and sent again as it is.
    """

    req_id: int
    extra: dict[str, Any]                 # ready / frames / seq, as the reply reports them
    window: np.ndarray | None = None      # the window to predict on, when one was due
    reply: list[bytes] | None = None      # the final answer, once there is one


@dataclass
class CameraState:
    name: str
    lane: int
    last_activity: float
    peer: str = ""
    in_flight: int = 0                    # jobs submitted and not yet answered
    requests: int = 0
    rings: dict[str, FrameRing] = field(default_factory=dict)
    pushes: dict[str, PushRecord] = field(default_factory=dict)

    def ring(self, model: str, window_shape: tuple[int, ...], stride: int) -> FrameRing:
        ring = self.rings.get(model)
        if ring is None or ring.shape != tuple(window_shape) or ring.stride != stride:
            # New, or the model was reloaded with another shape or stride: start over.
            ring = self.rings[model] = FrameRing(window_shape, stride)  # type: ignore[arg-type]
            self.pushes.pop(model, None)
        return ring

    def reset(self, models: list[str]) -> None:
        for name in models:
            self.rings.pop(name, None)
            self.pushes.pop(name, None)


@dataclass(frozen=True)
class Eviction:
    camera: str
    peer: str
    idle_s: float
    rule: str          # "own-share", "over-share" or "idle"


class CameraTable:
    def __init__(self, max_cameras: int) -> None:
        self.max_cameras = max_cameras
        # Both in activity order, least recent first (move_to_end on every request).
        self.cameras: OrderedDict[str, CameraState] = OrderedDict()
        self._by_peer: dict[str, OrderedDict[str, CameraState]] = {}
        self._free_lanes = list(range(max_cameras - 1, -1, -1))
        self.evictions = 0

    def get(self, name: str, now: float, peer: str = "") -> tuple[CameraState | None,
                                                                  Eviction | None]:
        """The camera's state, created on first sight (taking a slot as the module docstring
        says when the table is full), and the eviction that made room, if any. (None, None)
        when no slot can be had."""
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
            return cam, None
        evicted = None
        if not self._free_lanes:
            evicted = self._make_room(peer, now)
            if evicted is None:
                return None, None
        cam = CameraState(name, self._free_lanes.pop(), now, peer)
        self.cameras[name] = cam
        self._link(cam)
        return cam, evicted

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
    def _make_room(self, peer: str, now: float) -> Eviction | None:
        victim, rule = _least_recent(self.cameras, now - EVICT_IDLE_S), "idle"
        if victim is None:
            held = self._by_peer.get(peer)
            mine = len(held) if held else 0
            share = -(-self.max_cameras // (len(self._by_peer) + (0 if mine else 1)))
            if held and mine >= share:
                victim, rule = _least_recent(held, now - MIN_IDLE_S), "own-share"
            else:
                rule = "over-share"
                for cams in sorted(self._by_peer.values(), key=len, reverse=True):
                    if len(cams) <= share:
                        break
                    victim = _least_recent(cams, now)
                    if victim is not None:
                        break
        if victim is None:
            return None
        self._remove(victim)
        self.evictions += 1
        return Eviction(victim.name, victim.peer, round(now - victim.last_activity, 3), rule)

    def _remove(self, cam: CameraState) -> None:
        del self.cameras[cam.name]
        self._unlink(cam)
        self._free_lanes.append(cam.lane)

    def _link(self, cam: CameraState) -> None:
        self._by_peer.setdefault(cam.peer, OrderedDict())[cam.name] = cam

    def _unlink(self, cam: CameraState) -> None:
        cams = self._by_peer[cam.peer]
        del cams[cam.name]
        if not cams:
            del self._by_peer[cam.peer]


def _least_recent(cams: OrderedDict[str, CameraState], quiet_before: float
                  ) -> CameraState | None:
    """The least recently active camera with nothing in flight, if it was last active at or
    before `quiet_before`."""
    for cam in cams.values():
        if cam.last_activity > quiet_before:
            return None  # activity order: every later one is younger still
        if cam.in_flight == 0:
            return cam
    return None
