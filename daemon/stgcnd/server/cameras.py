"""Per-camera state, owned by the I/O loop alone: push rings, resend records, lane, activity.

A camera costs no thread and nothing on the device: joining takes a free lane index (each
executor prepared one CUDA stream and pinned rows per lane before READY) and a few Python
objects. `max_cameras` bounds the table, so invented camera ids cannot grow it without end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stgcnd.server.ring import FrameRing


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


class CameraTable:
    def __init__(self, max_cameras: int) -> None:
        self.max_cameras = max_cameras
        self.cameras: dict[str, CameraState] = {}
        self._free_lanes = list(range(max_cameras - 1, -1, -1))

    def get(self, name: str, now: float) -> CameraState | None:
        """The camera's state, created on first sight; None when max_cameras are served."""
        cam = self.cameras.get(name)
        if cam is None:
            if not self._free_lanes:
                return None
            cam = self.cameras[name] = CameraState(name, self._free_lanes.pop(), now)
        cam.last_activity = now
        return cam

    def reclaim_idle(self, now: float, idle_timeout: float) -> list[tuple[str, float]]:
        """Forget cameras idle for idle_timeout with nothing in flight; (name, idle seconds)."""
        gone = []
        for name, cam in list(self.cameras.items()):
            idle = now - cam.last_activity
            if cam.in_flight == 0 and idle > idle_timeout:
                del self.cameras[name]
                self._free_lanes.append(cam.lane)
                gone.append((name, idle))
        return gone

    def __len__(self) -> int:
        return len(self.cameras)
