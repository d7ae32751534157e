"""Skeleton graphs and the ST-GCN adjacency tensor A (the st-gcn paper's partitionings).

A loaded model always uses the A stored in its checkpoint, because forks disagree on
MediaPipe edge lists and centre joints; computed graphs serve the demo model and recognise a
checkpoint's layout.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Layout:
    name: str
    num_node: int
    edges: tuple[tuple[int, int], ...]
    center: int


# MediaPipe Pose's 33 landmarks and its published POSE_CONNECTIONS. The two mouth corners (9, 10)
# are only connected to each other; the partitioning below treats their (infinite) hop distance
# to the centre like every other equal distance, which keeps them as their own island.
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


def hop_distance(num_node: int, edges: tuple[tuple[int, int], ...], max_hop: int = 1) -> np.ndarray:
    """Hop distance between joints (inf beyond max_hop), self-links at distance 0."""
    adj = np.eye(num_node)
    for i, j in edges:
        adj[i, j] = adj[j, i] = 1
    dist = np.full((num_node, num_node), np.inf)
    reach = [np.linalg.matrix_power(adj, d) > 0 for d in range(max_hop + 1)]
    for d in range(max_hop, -1, -1):
        dist[reach[d]] = d
    return dist


def _normalize_columns(adj: np.ndarray) -> np.ndarray:
    col = adj.sum(axis=0)
    inv = np.where(col > 0, 1.0 / np.where(col > 0, col, 1.0), 0.0)
    return adj @ np.diag(inv)


def adjacency(layout: Layout | str, strategy: str = "spatial", max_hop: int = 1) -> np.ndarray:
    """The (K, V, V) partitioned adjacency of st-gcn, float32."""
    if isinstance(layout, str):
        layout = get_layout(layout)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    n = layout.num_node
    dist = hop_distance(n, layout.edges, max_hop)
    hops = range(max_hop + 1)
    base = np.zeros((n, n))
    for h in hops:
        base[dist == h] = 1
    norm = _normalize_columns(base)
    if strategy == "uniform":
        return norm[None].astype(np.float32)
    if strategy == "distance":
        parts = np.zeros((len(hops), n, n))
        for k, h in enumerate(hops):
            parts[k][dist == h] = norm[dist == h]
        return parts.astype(np.float32)
    centre_dist = dist[:, layout.center]
    parts_list = []
    for h in hops:
        root, closer, further = (np.zeros((n, n)) for _ in range(3))
        for i in range(n):
            for j in range(n):
                if dist[j, i] != h:
                    continue
                # j's and i's distance to the centre decide the partition (inf == inf: root).
                if centre_dist[j] == centre_dist[i]:
                    root[j, i] = norm[j, i]
                elif centre_dist[j] > centre_dist[i]:
                    closer[j, i] = norm[j, i]
                else:
                    further[j, i] = norm[j, i]
        if h == 0:
            parts_list.append(root)
        else:
            parts_list.extend([root + closer, further])
    return np.stack(parts_list).astype(np.float32)


def fingerprint(a: np.ndarray) -> str:
    """Short, stable identity of an adjacency tensor (shape + values rounded to 1e-6)."""
    arr = np.ascontiguousarray(np.round(np.asarray(a, dtype=np.float64), 6))
    h = hashlib.sha256(str(arr.shape).encode() + arr.tobytes())
    return h.hexdigest()[:16]


def match_layout(a: np.ndarray) -> tuple[str, str] | None:
    """(layout, strategy) whose recomputed A equals `a`, or None for a fork's own graph."""
    k, v, _ = a.shape
    for layout in LAYOUTS.values():
        if layout.num_node != v:
            continue
        for strategy in STRATEGIES:
            ref = adjacency(layout, strategy)
            if ref.shape[0] == k and np.allclose(ref, a, atol=1e-6):
                return layout.name, strategy
    return None
