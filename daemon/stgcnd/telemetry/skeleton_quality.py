"""Per-camera skeleton quality: whether a camera's poses are any good, not only how fast the
daemon answers them. Each stats interval gives one `skeleton_quality` record per camera and
a warning when `usable` falls below the floor. On the request path a frame is only copied
into its camera's batch, and only every SAMPLE_EVERY-th of them; the counting runs a batch at
a time, since per frame it cost a measurable share of the daemon's CPU (docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Union

import numpy as np

Record = Dict[str, Union[str, int, float, bool, None]]
BATCH = 64  # frames a camera's batch holds before it is reduced: 25 KB a camera for M=1
# The shares (no_person, visibility, low_visibility, out_of_frame) are of every 4th frame a
# camera sends in an interval, its first included: a camera at 25 Hz gives 63 samples in 10 s,
# and a quality floor or a feed state judged on shares needs no exact count, where the copy
# of every frame was a few microseconds of every request (issue #44). The counts (`frames`,
# `sent`, `refused_*`, and with them `silent` and `blocked`) stay exact.
SAMPLE_EVERY = 4
# Camera ids without a slot whose refusals are counted, per interval: ids invented cost
# nothing, and a camera refused from its first frame (NaN) is still told of (feed health).
MAX_STRANGERS = 64


@dataclass
class _Counts:
    seen: int = 0            # frames and windows counted (exact); every SAMPLE_EVERY-th reduced
    frames: int = 0          # frames reduced (sampled): the shares' denominator
    empty: int = 0
    joints: int = 0          # joints of present persons
    vis_sum: float = 0.0
    low: int = 0             # joints below the threshold
    outside: int = 0
    sent: int = 0            # requests: each counted once, where it was decided
    busy: int = 0
    refused: int = 0         # requests refused for what they sent (NaN, shape, model)
    batch: np.ndarray | None = None   # (BATCH, 3, V, M): frames not reduced yet
    pending: int = 0

    def reduce(self, threshold: float) -> None:
        """Count the batch's frames: a handful of numpy calls for all of them."""
        if self.batch is None or not self.pending:
            return
        f = self.batch[:self.pending]                    # (n, 3, V, M)
        self.pending = 0
        vis: np.ndarray = f[:, 2]                        # (n, V, M)
        present = np.any(vis > 0, axis=1)                # (n, M): a person in that slot
        self.frames += len(f)
        self.empty += int(len(f) - np.count_nonzero(present.any(axis=1)))
        of_person = np.broadcast_to(present[:, None, :], vis.shape)
        joints = vis[of_person]
        seen = (vis >= threshold) & of_person
        self.joints += joints.size
        self.vis_sum += float(joints.sum(dtype=np.float64))
        self.low += joints.size - int(np.count_nonzero(seen))
        x, y = f[:, 0][seen], f[:, 1][seen]              # the visible joints' coordinates
        self.outside += int(np.count_nonzero((x < 0) | (x > 1) | (y < 0) | (y > 1)))


# - `frames`: frames counted (exact), and `no_person`: the share with every person slot empty
#   (this and the shares below: of the frames sampled, SAMPLE_EVERY);
# - `visibility`: mean visibility of the joints of present persons, and `low_visibility`: the
#   share of those joints below the threshold;
# - `out_of_frame`: the share of visible joints with x or y outside 0..1 (the protocol's
#   normalised coordinates: pixels are all out of frame);
# - `sent`: frames and windows the camera sent, refused ones included; `refused_input`: those
#   refused for what they held; `refused_busy`: those refused busy (any reason);
# - `silent`: nothing sent in the interval; `blocked`: frames refused busy and none accepted.
#
# `usable` = (1 - no_person) x (1 - low_visibility): the share of joints the model can use.
# Whether a camera's `usable` is low (`skeleton_quality_low`, `_recovered`) is judged with the
# feed's health, under its hysteresis (server/feed_health.py).
class SkeletonQuality:
    def __init__(self, visibility_threshold: float = 0.5,
                 sample_every: int = SAMPLE_EVERY) -> None:
        self.threshold = visibility_threshold
        self.sample_every = sample_every  # 1: every frame (tests of exact shares)
        self._counts: dict[str, _Counts] = {}
        self._strangers = 0  # cameras without a slot counted this interval

    def add(self, camera: str, x: np.ndarray) -> None:
        """One request's pose, which counts as sent: `x`, a window (3, T, V, M), of which the
        newest frame counts, or a frame (3, V, M): x, y, visibility."""
        c = self._counts.get(camera)
        if c is None:
            c = self._counts[camera] = _Counts()
        c.sent += 1
        c.seen += 1
        if (c.seen - 1) % self.sample_every:  # the 1st, (1 + N)th, ...: see SAMPLE_EVERY
            return
        frame = x[:, -1] if x.ndim == 4 else x
        if c.batch is None or c.batch.shape[1:] != frame.shape:
            c.reduce(self.threshold)  # another model's shape: what is held goes first
            c.batch = np.empty((BATCH, *frame.shape), np.float32)
        c.batch[c.pending] = frame
        c.pending += 1
        if c.pending == BATCH:
            c.reduce(self.threshold)

    def refused(self, camera: str, busy: bool, known: bool, counted: bool = False) -> None:
        """An infer or push of `camera` refused busy or for its input; `known`: the camera
        has a slot; `counted`: its pose was counted (`add`: a push's frame, kept), so that it
        is not sent twice. The caller says it, whatever the refusal's reason or place: a
        reason added before the frame is counted cannot undercount `sent`."""
        c = self._counts.get(camera)
        if c is None:
            if not known and self._strangers >= MAX_STRANGERS:
                return
            self._strangers += not known
            c = self._counts[camera] = _Counts()
        c.sent += not counted
        if busy:
            c.busy += 1
        else:
            c.refused += 1

    def drain(self, cameras: list[str]) -> list[Record]:
        """One record per camera in `cameras` or seen."""
        counts, self._counts, self._strangers = self._counts, {}, 0
        records: list[Record] = []
        for camera in sorted(set(cameras) | set(counts)):
            c = counts.get(camera, _Counts())
            c.reduce(self.threshold)
            records.append(_record(camera, c))
        return records


def _share(n: int, of: int) -> float | None:
    return round(n / of, 4) if of else None


def _record(camera: str, c: _Counts) -> Record:
    no_person = _share(c.empty, c.frames)
    low = _share(c.low, c.joints)
    usable = None
    if no_person is not None:
        usable = round((1.0 - no_person) * (1.0 - (low if low is not None else 1.0)), 4)
    sent = c.sent
    return {"camera": camera, "frames": c.seen, "no_person": no_person,
            "visibility": round(c.vis_sum / c.joints, 4) if c.joints else None,
            "low_visibility": low,
            "out_of_frame": _share(c.outside, c.joints - c.low),
            "usable": usable, "sent": sent, "refused_input": c.refused, "refused_busy": c.busy,
            "silent": sent == 0, "blocked": c.seen == 0 and c.busy > 0}
