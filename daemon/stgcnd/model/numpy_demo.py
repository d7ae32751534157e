"""The demo model without torch: its folded numpy weights, and a numpy forward as reference.

Stands in for a LoadedModel wherever the engine store, the registry and validation need one
(spec, num_class, labels, checkpoint_sha256, describe(), reference logits), so that the demo
can be exported (stgcnd.export.demo_onnx), built, validated and served with ONNX Runtime alone.
`module` is None: there is no PyTorch network, hence no torch backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stgcnd.log import get_logger
from stgcnd.model.demo import DEMO_WARNING, spec_arrays
from stgcnd.model.folded import FoldedStream, fold_state, folded_logits
from stgcnd.model.graph import fingerprint
from stgcnd.model.spec import ModelSpec, default_labels

log = get_logger(__name__)


@dataclass
class NumpyDemoModel:
    spec: ModelSpec
    streams: tuple[FoldedStream, ...]
    adjacency: np.ndarray
    num_class: int
    labels: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    module: None = None                 # no PyTorch network
    checkpoint_sha256: None = None      # the demo has no checkpoint file

    @property
    def adjacency_fingerprint(self) -> str:
        return fingerprint(self.adjacency)

    def describe(self) -> dict[str, Any]:
        k, v, _ = self.adjacency.shape
        return {"two_stream": len(self.streams) == 2, "num_class": self.num_class,
                "partitions": int(k), "num_node": int(v), "edge_importance": True,
                "demo": True, "checkpoint_sha256": None,
                "adjacency_fingerprint": self.adjacency_fingerprint,
                "labels": list(self.labels), "reference": "numpy"}

    def reference_logits(self, windows: np.ndarray, batch: int = 4) -> np.ndarray:
        """fp32 logits of windows (N, 3, T, V, M), in batches to bound memory."""
        x = np.ascontiguousarray(windows, dtype=np.float32)
        return np.concatenate([folded_logits(self.streams, x[i:i + batch], self.spec.motion)
                               for i in range(0, len(x), batch)])


def load_numpy_demo(spec: ModelSpec) -> NumpyDemoModel:
    """The demo model `spec` (no checkpoint) describes, from its seeded numpy weights."""
    if not spec.is_demo:
        raise ValueError("load_numpy_demo is for the demo model only (no checkpoint)")
    state = spec_arrays(spec)
    streams = fold_state(state)
    a = state["origin_stream.A" if "origin_stream.A" in state else "A"]
    log.warning("demo_model", message=DEMO_WARNING, layout=spec.layout, seed=spec.seed,
                reference="numpy")
    labels = spec.labels or default_labels(spec.num_class)
    return NumpyDemoModel(spec, streams, a, spec.num_class, labels, [DEMO_WARNING])
