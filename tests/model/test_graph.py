from __future__ import annotations

import numpy as np
import pytest

from stgcnd.model.graph import LAYOUTS, adjacency, fingerprint, hop_distance, match_layout


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_spatial_partitions_sum_to_normalised_adjacency(name):
    lay = LAYOUTS[name]
    a = adjacency(lay, "spatial")
    assert a.shape == (3, lay.num_node, lay.num_node)
    total = a.sum(axis=0)
    # Column-normalised: every joint's incoming weights sum to 1.
    np.testing.assert_allclose(total.sum(axis=0), np.ones(lay.num_node), atol=1e-6)
    u = adjacency(lay, "uniform")[0]
    np.testing.assert_allclose(total, u, atol=1e-6)
    assert match_layout(a) == (name, "spatial")


def test_mediapipe_graph_facts():
    lay = LAYOUTS["mediapipe"]
    assert lay.num_node == 33 and len(lay.edges) == 35
    d = hop_distance(33, lay.edges)
    assert d[11, 12] == 1 and d[11, 23] == 1 and d[0, 0] == 0 and np.isinf(d[0, 27])
    # Mouth corners are an island: joined to each other only.
    assert d[9, 10] == 1 and np.isinf(d[9, 0])


def test_fingerprint_is_stable_and_sensitive():
    a = adjacency("mediapipe", "spatial")
    assert fingerprint(a) == fingerprint(a.copy())
    b = a.copy()
    b[1, 2, 3] += 1e-3
    assert fingerprint(a) != fingerprint(b)
    assert match_layout(b) is None
