"""Per-camera skeleton quality: whether a camera's poses are any good, not only how fast the
daemon answers them. A camera that sees nobody, or whose pose estimator loses half the
joints, otherwise looks healthy in the latency lines.

Every window or pushed frame is counted on the I/O loop (a few numpy reductions over at most
(3, T, V, M) floats: tens of microseconds for a 150-frame window). Each stats interval gives
one `skeleton_quality` record per camera known to the daemon:

- frames: frames seen (a window counts all its frames; windows overlap, so this is a weight,
  not a frame rate) and `no_person`: the share with every person slot empty;
- `visibility`: mean visibility of the joints of present persons, and `low_visibility`: the
  share of those joints below the threshold;
- `out_of_frame`: the share of visible joints with x or y outside 0..1 (None where the
  camera sends pixel coordinates: values beyond 2);
- `silent`: no frame in the interval; `blocked`: frames refused busy and none accepted.

`usable` = (1 - no_person) x (1 - low_visibility): the share of joints the model can use. A
camera whose `usable` falls below the floor gets one warning (`skeleton_quality_low`), and a
line again only once it has recovered (`skeleton_quality_recovered`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Union

import numpy as np

Record = Dict[str, Union[str, int, float, bool, None]]


@dataclass
class _Counts:
    frames: int = 0
    empty: int = 0
    joints: int = 0          # joints of present persons
    vis_sum: float = 0.0
    low: int = 0
    visible: int = 0         # joints at or above the threshold
    outside: int = 0
    pixels: bool = False
    busy: int = 0


class SkeletonQuality:
    def __init__(self, visibility_threshold: float = 0.5, floor: float = 0.5) -> None:
        self.threshold = visibility_threshold
        self.floor = floor
        self._counts: dict[str, _Counts] = {}
        self._low: set[str] = set()   # cameras warned about, not yet recovered

    def add(self, camera: str, x: np.ndarray) -> None:
        """`x`: a window (3, T, V, M) or a frame (3, V, M): x, y, visibility."""
        c = self._counts.setdefault(camera, _Counts())
        a = x.reshape(3, -1, x.shape[-2], x.shape[-1])
        vis = a[2]                                       # (T, V, M)
        present = (vis > 0).any(axis=1)                  # (T, M): a person in that slot
        frames = a.shape[1]
        c.frames += frames
        c.empty += int(frames - present.any(axis=1).sum())
        joints = vis.transpose(0, 2, 1)[present]         # (persons present, V)
        c.joints += joints.size
        c.vis_sum += float(joints.sum())
        seen = joints >= self.threshold
        c.low += int(joints.size - seen.sum())
        c.visible += int(seen.sum())
        xy = a[:2].transpose(1, 3, 2, 0)[present][seen]  # (visible joints, 2)
        if xy.size and float(np.abs(xy).max()) > 2.0:
            c.pixels = True
        elif xy.size:
            c.outside += int(((xy < 0.0) | (xy > 1.0)).any(axis=1).sum())

    def refused_busy(self, camera: str) -> None:
        self._counts.setdefault(camera, _Counts()).busy += 1

    def drain(self, cameras: list[str]) -> tuple[list[Record], list[Record]]:
        """(one record per camera in `cameras` or seen, the warnings and recoveries due)."""
        counts, self._counts = self._counts, {}
        records: list[Record] = []
        notes: list[Record] = []
        for camera in sorted(set(cameras) | set(counts)):
            c = counts.get(camera, _Counts())
            record = _record(camera, c)
            records.append(record)
            usable = record["usable"]
            if not isinstance(usable, float):
                continue
            if usable < self.floor and camera not in self._low:
                self._low.add(camera)
                notes.append({**record, "event": "skeleton_quality_low", "floor": self.floor})
            elif usable >= self.floor and camera in self._low:
                self._low.discard(camera)
                notes.append({**record, "event": "skeleton_quality_recovered"})
        return records, notes


def _share(n: int, of: int) -> float | None:
    return round(n / of, 4) if of else None


def _record(camera: str, c: _Counts) -> Record:
    no_person = _share(c.empty, c.frames)
    low = _share(c.low, c.joints)
    usable = None
    if no_person is not None:
        usable = round((1.0 - no_person) * (1.0 - (low if low is not None else 1.0)), 4)
    return {"camera": camera, "frames": c.frames, "no_person": no_person,
            "visibility": round(c.vis_sum / c.joints, 4) if c.joints else None,
            "low_visibility": low,
            "out_of_frame": None if c.pixels else _share(c.outside, c.visible),
            "usable": usable, "refused_busy": c.busy,
            "silent": c.frames == 0 and c.busy == 0, "blocked": c.frames == 0 and c.busy > 0}
