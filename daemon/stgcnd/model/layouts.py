"""The skeleton layouts (joints, edges, centre) and partitionings' names that configurations
and model specs are checked against; their adjacency is model/graph.py's, loaded apart."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    name: str
    num_node: int
    edges: tuple[tuple[int, int], ...]
    center: int


# MediaPipe Pose's 33 landmarks and its published POSE_CONNECTIONS. The two mouth corners (9, 10)
# are only connected to each other; the partitioning (model/graph.py) treats their (infinite)
# hop distance to the centre like every other equal distance, which keeps them as their own
# island.
_MEDIAPIPE_EDGES = (
    (0, 1), (1, 2), (2, 3), (3, 7), (0, 4), (4, 5), (5, 6), (6, 8), (9, 10),
    (11, 12), (11, 13), (13, 15), (15, 17), (15, 19), (15, 21), (17, 19),
    (12, 14), (14, 16), (16, 18), (16, 20), (16, 22), (18, 20),
    (11, 23), (12, 24), (23, 24), (23, 25), (24, 26), (25, 27), (26, 28),
    (27, 29), (28, 30), (29, 31), (30, 32), (27, 31), (28, 32),
)
_OPENPOSE_EDGES = (
    (4, 3), (3, 2), (7, 6), (6, 5), (13, 12), (12, 11), (10, 9), (9, 8), (11, 5),
    (8, 2), (5, 1), (2, 1), (0, 1), (15, 0), (14, 0), (17, 15), (16, 14),
)
_NTU_EDGES_1BASED = (
    (1, 2), (2, 21), (3, 21), (4, 3), (5, 21), (6, 5), (7, 6), (8, 7), (9, 21),
    (10, 9), (11, 10), (12, 11), (13, 1), (14, 13), (15, 14), (16, 15), (17, 1),
    (18, 17), (19, 18), (20, 19), (22, 23), (23, 8), (24, 25), (25, 12),
)
_COCO_EDGES = (
    (15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6),
    (5, 7), (6, 8), (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6),
)

LAYOUTS: dict[str, Layout] = {
    # Centre: the nose. Forks also use a shoulder or hip joint; the checkpoint's A decides.
    "mediapipe": Layout("mediapipe", 33, _MEDIAPIPE_EDGES, center=0),
    "openpose": Layout("openpose", 18, _OPENPOSE_EDGES, center=1),
    "ntu-rgb+d": Layout("ntu-rgb+d", 25,
                        tuple((i - 1, j - 1) for i, j in _NTU_EDGES_1BASED), center=20),
    "coco": Layout("coco", 17, _COCO_EDGES, center=0),
}
STRATEGIES = ("uniform", "distance", "spatial")


def get_layout(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown layout {name!r}; choose one of {', '.join(LAYOUTS)}") from None
