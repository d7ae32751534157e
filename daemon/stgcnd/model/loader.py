"""Turn a ModelSpec into an eval-mode PyTorch network: from a checkpoint, or the demo model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from stgcnd.errors import BackendUnavailable, CheckpointError
from stgcnd.fsutil import file_sha256
from stgcnd.log import get_logger
from stgcnd.model.checkpoint import (
    CheckpointInfo,
    check_against_spec,
    describe,
    inspect_state_dict,
    load_strict,
    read_state_dict,
)
from stgcnd.model.demo import DEMO_WARNING, demo_state_dict
from stgcnd.model.graph import adjacency, fingerprint, match_layout
from stgcnd.model.spec import ModelSpec, default_labels
from stgcnd.model.stgcn import STGCN, TwoStreamSTGCN
from stgcnd.versions import torch_unusable

log = get_logger(__name__)


@dataclass
class LoadedModel:
    """An eval-mode network with what is known about where it came from."""

    module: nn.Module
    spec: ModelSpec
    info: CheckpointInfo
    checkpoint_sha256: str | None
    adjacency_fingerprint: str
    labels: tuple[str, ...]
    notes: list[str] = field(default_factory=list)

    @property
    def num_class(self) -> int:
        return self.info.num_class

    def describe(self) -> dict[str, Any]:
        return {**describe(self.info), "demo": self.spec.is_demo,
                "checkpoint_sha256": self.checkpoint_sha256,
                "adjacency_fingerprint": self.adjacency_fingerprint,
                "labels": list(self.labels)}


def build_network(info: CheckpointInfo, spec: ModelSpec) -> nn.Module:
    a = next(iter(info.adjacency.values()))
    if info.two_stream:
        return TwoStreamSTGCN(a, info.num_class, info.in_channels, info.edge_importance,
                              spec.motion, spec.graph_op, info.widths)  # type: ignore[arg-type]
    return STGCN(a, info.num_class, info.in_channels, info.edge_importance,
                 spec.graph_op, info.widths)  # type: ignore[arg-type]


def load_model(spec: ModelSpec) -> LoadedModel:
    """Build the network of `spec`, loading its checkpoint strictly; eval mode, on the CPU."""
    too_old = torch_unusable(torch.__version__)
    if too_old:  # before anything fails deeper down in a way that names torch's internals
        raise BackendUnavailable(too_old)
    notes: list[str] = []
    if spec.checkpoint is None:
        state = demo_state_dict(spec.layout, spec.strategy, spec.num_class, spec.two_stream,
                                seed=spec.seed)
        source, sha = "demo model", None
        notes.append(DEMO_WARNING)
        log.warning("demo_model", message=DEMO_WARNING, layout=spec.layout, seed=spec.seed)
    else:
        source = str(spec.checkpoint)
        state = read_state_dict(spec.checkpoint)
        sha = file_sha256(spec.checkpoint)
    info = inspect_state_dict(state, source)
    check_against_spec(info, spec.layout, spec.labels, source)
    module = build_network(info, spec)
    load_strict(module, state, source)
    module.eval()

    a = next(iter(info.adjacency.values())).numpy()
    fp = fingerprint(a)
    match = match_layout(a)
    streams_differ = len({fingerprint(t.numpy()) for t in info.adjacency.values()}) > 1
    if streams_differ:
        notes.append("the two streams store different graphs A; each stream uses its own")
    named = adjacency(spec.layout, spec.strategy if info.partitions != 3 else "spatial")
    if match is None or match[0] != spec.layout:
        msg = (f"the checkpoint's graph A (fingerprint {fp}) differs from stgcnd's "
               f"{spec.layout!r} graph (fingerprint {fingerprint(named)}); the checkpoint's A "
               "is used, as trained")
        if spec.checkpoint is not None:
            notes.append(msg)
            log.warning("adjacency_differs", checkpoint=source, fingerprint=fp,
                        layout=spec.layout, layout_fingerprint=fingerprint(named))
    log.info("model_loaded", source=source, adjacency_fingerprint=fp,
             layout_match=f"{match[0]}/{match[1]}" if match else None, **describe(info))
    labels = spec.labels or default_labels(info.num_class)
    return LoadedModel(module, spec, info, sha, fp, labels, notes)


def reference_logits(model: LoadedModel, windows: Any, batch: int = 16) -> Any:
    """fp32 PyTorch logits on the CPU for windows (N, 3, T, V, M): the reference of every check."""

    x = np.ascontiguousarray(windows, dtype=np.float32)
    outs = []
    with torch.inference_mode():
        for i in range(0, len(x), batch):
            outs.append(model.module(torch.from_numpy(x[i:i + batch])).numpy())
    if not outs:
        raise CheckpointError("no windows to run")
    return np.concatenate(outs)
