"""Turn per-frame MediaPipe pose landmarks into ST-GCN windows (3, T, V, M), channels (x, y,
visibility). `SkeletonWindow` keeps each person in the same slot for the whole window
(tracked by skeleton centre, in units of the person's size); its rules are described above
the class.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

# MediaPipe Pose landmark indices of the left and right hip.
_MEDIAPIPE_HIPS = (23, 24)
_MEDIAPIPE_KEYPOINTS = 33
# Keypoints with at least this visibility define a person's size.
_VISIBLE = 0.5
# Who gets a free slot first; or pass a score function of one (V, 3) pose (higher first).
SELECTIONS = ("largest", "most_visible", "first")


class _Slot:
    __slots__ = ("centre", "missing", "pose", "scale")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.pose: np.ndarray | None = None  # (V, 3) last pose seen
        self.centre: np.ndarray | None = None
        self.scale = 1.0
        self.missing = 0

    @property
    def active(self) -> bool:
        return self.pose is not None


# Rules:
# - a detected person goes to the slot whose last centre is nearest, if it is within ``max_jump``
#   person sizes; remaining people take free slots (lowest index first);
# - a slot whose person is not seen keeps showing their last pose for up to ``max_missing`` frames
#   (detectors drop single frames), then turns to zeros and becomes free;
# - with more people than free slots, tracked people keep their slots (switching someone out
#   mid-window would make the skeleton teleport) and ``select`` decides which newcomers get the
#   free ones; the rest are ignored for that frame (`ignored` counts them):
#
#   - ``"largest"`` (the default): the largest bounding box of visible keypoints first. In a
#     multi-person MediaPipe Pose pipeline the person who matters is usually the most prominent
#     one, nearest the camera; bystanders far behind are small. It is also the choice that does
#     not depend on the detector's output order, which means nothing.
#   - ``"most_visible"``: the highest mean visibility first (the most complete skeleton, e.g.
#     when people are partly hidden by shelves).
#   - ``"first"``: the order the detector listed them in.
#   - a function ``(pose: ndarray (V, 3)) -> float``: higher first.
class SkeletonWindow:
    """A rolling window of the last ``frames`` skeleton frames for up to ``persons`` people.

    Each call to `append` (or `frame`) takes the people detected in one video frame: a sequence
    of persons, each either an array-like (V, 3) of (x, y, visibility), a sequence of V landmark
    objects with ``.x``, ``.y``, ``.visibility`` (MediaPipe Tasks' ``result.pose_landmarks``
    is a list of those), or an object with ``.landmark`` (the legacy solution's
    ``results.pose_landmarks``). None or an empty list means nobody was detected.

    With more people than ``persons``, people already tracked keep their slots and ``select``
    picks who gets a free one: ``"largest"`` (default, the most prominent person),
    ``"most_visible"``, ``"first"`` (detector order) or a score function of a (V, 3) pose;
    `ignored` says how many were left out of the last frame. See the comment above the class.

    Not thread-safe; use one per camera.
    """

    def __init__(
        self,
        frames: int = 150,
        persons: int = 1,
        keypoints: int = _MEDIAPIPE_KEYPOINTS,
        *,
        max_missing: int = 10,
        max_jump: float = 1.0,
        select: str | Callable[[np.ndarray], float] = "largest",
    ) -> None:
        if frames < 1 or persons < 1 or keypoints < 1:
            raise ValueError("frames, persons and keypoints must all be >= 1")
        if max_missing < 0:
            raise ValueError(f"max_missing must be >= 0 frames, got {max_missing}")
        if max_jump <= 0:
            raise ValueError(f"max_jump must be > 0 person sizes, got {max_jump}")
        if not callable(select) and select not in SELECTIONS:
            raise ValueError(
                f"select must be one of {', '.join(map(repr, SELECTIONS))} or a function "
                f"(pose (V, 3)) -> score, got {select!r}"
            )
        self.select = select
        self._ignored = 0
        self._warned_ignored = False
        self.frames = frames
        self.persons = persons
        self.keypoints = keypoints
        self.max_missing = max_missing
        self.max_jump = max_jump
        self._ring = np.zeros((frames, 3, keypoints, persons), dtype=np.float32)
        self._seen = 0
        self._slots = [_Slot() for _ in range(persons)]

    @property
    def ready(self) -> bool:
        """True once ``frames`` frames have been added (the window has no padding)."""
        return self._seen >= self.frames

    @property
    def frames_seen(self) -> int:
        return self._seen

    @property
    def occupied(self) -> tuple[bool, ...]:
        """Which slots currently hold a person (seen, or missing for at most max_missing)."""
        return tuple(slot.active for slot in self._slots)

    @property
    def ignored(self) -> int:
        """People in the last frame who got no slot (more people than ``persons``)."""
        return self._ignored

    def append(self, people: Any) -> None:
        """Add one video frame's detected people to the window."""
        self.frame(people)

    def frame(self, people: Any) -> np.ndarray:
        """Add one video frame's people and return that frame as (3, V, M) float32 (for push)."""
        poses = self._parse_people(people)
        out = np.zeros((3, self.keypoints, self.persons), dtype=np.float32)
        assigned = self._assign(poses)
        self._ignored = len(poses) - len(assigned)
        if self._ignored and not self._warned_ignored and len(poses) > self.persons:
            self._warned_ignored = True  # once per window: a crowded scene is not an error
            warnings.warn(f"{len(poses)} people in one frame for a window of {self.persons} "
                          f"person slot(s): {self._ignored} left out (the `ignored` property "
                          "counts them each frame); a model trained for more people takes "
                          "them (persons = its M)", stacklevel=2)
        for index, slot in enumerate(self._slots):
            person = assigned.get(index)
            if person is not None:
                pose = poses[person]
                slot.pose = pose
                slot.centre = _centre(pose)
                slot.scale = _size(pose)
                slot.missing = 0
            elif slot.active:
                slot.missing += 1
                if slot.missing > self.max_missing:
                    slot.clear()
            if slot.pose is not None:
                out[:, :, index] = slot.pose.T
        self._ring[self._seen % self.frames] = out
        self._seen += 1
        return out.copy()

    def window(self) -> np.ndarray:
        """The last ``frames`` frames as a new (3, T, V, M) float32 array, oldest first.

        Before the window is full the missing older frames are zeros at the front.
        """
        out = np.zeros((3, self.frames, self.keypoints, self.persons), dtype=np.float32)
        count = min(self._seen, self.frames)
        if count:
            order = (self._seen - count + np.arange(count)) % self.frames
            out[:, self.frames - count :] = self._ring[order].transpose(1, 0, 2, 3)
        return out

    def reset(self) -> None:
        """Forget all frames and people (e.g. after a camera cut)."""
        self._ring[:] = 0
        self._seen = 0
        for slot in self._slots:
            slot.clear()

    # ------------------------------------------------------------------ internals

    def _assign(self, poses: list[np.ndarray]) -> dict[int, int]:
        """Map slot index -> index into ``poses``."""
        centres = [_centre(p) for p in poses]
        candidates = []
        for s, slot in enumerate(self._slots):
            if not slot.active:
                continue
            assert slot.centre is not None
            for p, centre in enumerate(centres):
                distance = float(np.linalg.norm(centre - slot.centre)) / slot.scale
                if distance <= self.max_jump:
                    candidates.append((distance, s, p))
        assigned: dict[int, int] = {}
        taken: set[int] = set()
        # Greedy nearest-first is optimal enough for a handful of people moving a little
        # between frames, and never lets one person claim two slots.
        for _, s, p in sorted(candidates):
            if s not in assigned and p not in taken:
                assigned[s] = p
                taken.add(p)
        newcomers = [p for p in range(len(poses)) if p not in taken]
        free = [s for s, slot in enumerate(self._slots) if not slot.active]
        # When no slot is free, a newcomer may take the slot of someone currently missing
        # (longest missing first) rather than be dropped while a ghost holds the slot.
        missing = sorted(
            (s for s, slot in enumerate(self._slots) if slot.active and s not in assigned),
            key=lambda s: -self._slots[s].missing,
        )
        open_slots = free + missing
        if len(newcomers) > len(open_slots) and self.select != "first":
            # Someone is left out: keep the best-ranked (sorted() is stable, so equal scores
            # keep the detector's order), then seat them in the detector's order as before.
            score = self._score_function()
            ranked = sorted(newcomers, key=lambda p: -float(score(poses[p])))
            newcomers = sorted(ranked[: len(open_slots)])
        for p, s in zip(newcomers, open_slots):
            assigned[s] = p
        return assigned

    def _score_function(self) -> Callable[[np.ndarray], float]:
        if callable(self.select):
            return self.select
        return _size if self.select == "largest" else _mean_visibility

    def _parse_people(self, people: Any) -> list[np.ndarray]:
        if people is None:
            return []
        if hasattr(people, "landmark"):
            people = [people]
        elif isinstance(people, np.ndarray):
            people = [people] if people.ndim == 2 else list(people)
        return [self._parse_person(person, i) for i, person in enumerate(people)]

    def _parse_person(self, person: Any, index: int) -> np.ndarray:
        if hasattr(person, "landmark"):
            person = person.landmark
        if not isinstance(person, np.ndarray):
            # Protobuf repeated fields are iterable but not always registered as Sequence.
            person = list(person)
            if person and hasattr(person[0], "x"):
                person = [[lm.x, lm.y, _visibility(lm)] for lm in person]
        try:
            pose = np.asarray(person, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"person {index}: expected ({self.keypoints}, 3) numbers (x, y, visibility) "
                f"or {self.keypoints} landmarks with .x .y .visibility: {exc}"
            ) from None
        if pose.shape != (self.keypoints, 3):
            raise ValueError(
                f"person {index}: expected {self.keypoints} keypoints of (x, y, visibility), "
                f"i.e. shape ({self.keypoints}, 3), got {pose.shape}"
            )
        if not np.isfinite(pose).all():
            raise ValueError(f"person {index}: keypoints contain NaN or Inf")
        return pose


def _visibility(landmark: Any) -> float:
    # MediaPipe Tasks leaves visibility unset (None) on some outputs; treat it as not seen.
    value = getattr(landmark, "visibility", None)
    return 0.0 if value is None else float(value)


def _centre(pose: np.ndarray) -> np.ndarray:
    xy = pose[:, :2]
    if len(pose) == _MEDIAPIPE_KEYPOINTS:
        return xy[list(_MEDIAPIPE_HIPS)].mean(axis=0)
    return xy.mean(axis=0)


def _mean_visibility(pose: np.ndarray) -> float:
    return float(pose[:, 2].mean())


def _size(pose: np.ndarray) -> float:
    """Bounding-box diagonal of the visible keypoints (all of them if none is visible)."""
    visible = pose[pose[:, 2] >= _VISIBLE, :2]
    xy = visible if len(visible) >= 2 else pose[:, :2]
    extent = xy.max(axis=0) - xy.min(axis=0)
    return max(float(np.hypot(extent[0], extent[1])), 1e-6)
