"""Skeleton graphs and the ST-GCN adjacency tensor A (the st-gcn paper's partitionings).

The layouts themselves are model/layouts.py's. A loaded model always uses the A stored in its
checkpoint, because forks disagree on MediaPipe edge lists and centre joints; computed graphs
serve the demo model and recognise a checkpoint's layout.
"""

from __future__ import annotations

import hashlib

import numpy as np

from stgcnd.model.layouts import LAYOUTS, STRATEGIES, Layout, get_layout


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
