"""Per-camera skeleton quality: whether a camera's poses are any good, not only how fast the
daemon answers them. A camera that sees nobody, or whose pose estimator loses half the
joints, otherwise looks healthy in the latency lines.

Every pushed frame, and the newest frame of every window, is counted on the I/O loop: a few
numpy reductions over (3, V, M) floats. (All 150 frames of a window cost 176 us on a 2-core
Zen 5 for one person, 400 us for five, as much as the rest of a request; windows overlap
anyway, so the newest frame samples the camera.) Each stats interval gives one
`skeleton_quality` record per camera known to the daemon:

- `frames`: frames counted, and `no_person`: the share with every person slot empty;
- `visibility`: mean visibility of the joints of present persons, and `low_visibility`: the
  share of those joints below the threshold;
- `out_of_frame`: the share of visible joints with x or y outside 0..1 (None where the
  camera sends pixel coordinates: values beyond 10);
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
# Coordinates beyond this are pixels, not MediaPipe's 0..1 (whose joints off the picture reach
# a little past 1): out-of-frame is then not judged.
PIXELS_ABOVE = 10.0


@dataclass
class _Counts:
    frames: int = 0
    empty: int = 0
    joints: int = 0          # joints of present persons
    vis_sum: float = 0.0
    low: int = 0             # joints below the threshold
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
        """`x`: a window (3, T, V, M), of which the newest frame counts, or a frame (3, V, M):
        x, y, visibility."""
        c = self._counts.setdefault(camera, _Counts())
        frame = x[:, -1] if x.ndim == 4 else x
        vis = frame[2]                                   # (V, M)
        present = (vis > 0).any(axis=0)                  # (M,): a person in that slot
        c.frames += 1
        if not present.any():
            c.empty += 1
            return
        joints = vis[:, present]                         # (V, persons present)
        seen = joints >= self.threshold
        c.joints += joints.size
        c.vis_sum += float(joints.sum(dtype=np.float64))
        c.low += joints.size - int(seen.sum())
        xy = frame[:2][:, :, present][:, seen]           # (2, visible joints)
        if xy.size and float(np.abs(xy).max()) > PIXELS_ABOVE:
            c.pixels = True
        elif xy.size:
            c.outside += int(((xy < 0.0) | (xy > 1.0)).any(axis=0).sum())

    def refused_busy(self, camera: str) -> None:
        self._counts.setdefault(camera, _Counts()).busy += 1

    def drain(self, cameras: list[str]) -> tuple[list[Record], list[Record]]:
        """(one record per camera in `cameras` or seen, the warnings and recoveries due)."""
        counts, self._counts = self._counts, {}
        known = set(cameras) | set(counts)
        self._low &= known  # a camera gone is not remembered
        records: list[Record] = []
        notes: list[Record] = []
        for camera in sorted(known):
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
            "out_of_frame": None if c.pixels else _share(c.outside, c.joints - c.low),
            "usable": usable, "refused_busy": c.busy,
            "silent": c.frames == 0 and c.busy == 0, "blocked": c.frames == 0 and c.busy > 0}
