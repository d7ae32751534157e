"""The seeded demo model: a full-size network with random weights, for trying stgcnd out.

Its predictions mean nothing. Weights come from numpy's seeded generator (not torch's), so the
same seed gives the same bytes on every machine and torch release, and the engine store can
reuse artefacts built from it. The same generator makes original-format test checkpoints.
"""

from __future__ import annotations

import numpy as np
import torch

from stgcnd.model.graph import adjacency
from stgcnd.model.stgcn import STGCN

DEMO_WARNING = ("demo model: random weights, its predictions mean nothing; "
                "configure a checkpoint for real use")


def random_stream_state(a: np.ndarray, num_class: int, rng: np.random.Generator,
                        in_channels: int = 3, edge_importance: bool = True
                        ) -> dict[str, torch.Tensor]:
    """A single stream's state_dict with the original key names and randomised BN statistics."""
    template = STGCN(torch.from_numpy(a), num_class, in_channels, edge_importance)
    state: dict[str, torch.Tensor] = {}
    for key, value in template.state_dict().items():
        shape = tuple(value.shape)
        if key == "A":
            arr = a
        elif key.endswith("num_batches_tracked"):
            state[key] = torch.tensor(1000, dtype=torch.long)
            continue
        elif key.endswith("running_mean"):
            arr = rng.normal(0.0, 0.2, shape)
        elif key.endswith("running_var"):
            arr = rng.uniform(0.5, 2.0, shape)
        elif key.startswith("edge_importance"):
            arr = rng.uniform(0.5, 1.5, shape)
        elif value.dim() == 1 and key.endswith("weight"):  # BN gamma
            arr = rng.uniform(0.7, 1.3, shape)
        elif key.endswith("bias"):
            arr = rng.normal(0.0, 0.05, shape)
        else:  # conv weights: variance-preserving through ReLU
            fan_in = int(np.prod(shape[1:]))
            arr = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
        state[key] = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
    return state


def demo_state_dict(layout: str = "mediapipe", strategy: str = "spatial", num_class: int = 2,
                    two_stream: bool = True, seed: int = 0, edge_importance: bool = True
                    ) -> dict[str, torch.Tensor]:
    """An original-format (two-stream or single-stream) state_dict with random weights."""
    rng = np.random.default_rng(seed)
    a = adjacency(layout, strategy)
    if not two_stream:
        return random_stream_state(a, num_class, rng, edge_importance=edge_importance)
    state = {}
    for stream in ("origin_stream", "motion_stream"):
        sub = random_stream_state(a, num_class, rng, edge_importance=edge_importance)
        state.update({f"{stream}.{k}": v for k, v in sub.items()})
    return state
