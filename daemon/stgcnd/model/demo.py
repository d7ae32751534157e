"""The seeded demo model: a full-size network with random weights, for trying stgcnd out.

Its predictions mean nothing. Weights come from numpy's seeded generator, without torch, so
the same seed gives the same bytes everywhere, artefacts are reused, and ONNX Runtime alone
can serve it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from stgcnd.model.architecture import WIDTHS, stream_state_layout
from stgcnd.model.graph import adjacency

if TYPE_CHECKING:
    import torch

DEMO_WARNING = ("demo model: random weights, its predictions mean nothing; "
                "configure a checkpoint for real use")


def random_stream_arrays(a: np.ndarray, keys: list[tuple[str, tuple[int, ...]]],
                         rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A single stream's weights (`keys`: stream_state_layout) with randomised BN statistics."""
    state: dict[str, np.ndarray] = {}
    for key, shape in keys:
        if key == "A":
            arr = a
        elif key.endswith("num_batches_tracked"):
            state[key] = np.array(1000, dtype=np.int64)
            continue
        elif key.endswith("running_mean"):
            arr = rng.normal(0.0, 0.2, shape)
        elif key.endswith("running_var"):
            arr = rng.uniform(0.5, 2.0, shape)
        elif key.startswith("edge_importance"):
            arr = rng.uniform(0.5, 1.5, shape)
        elif len(shape) == 1 and key.endswith("weight"):  # BN gamma
            arr = rng.uniform(0.7, 1.3, shape)
        elif key.endswith("bias"):
            arr = rng.normal(0.0, 0.05, shape)
        else:  # conv weights: variance-preserving through ReLU
            fan_in = int(np.prod(shape[1:]))
            arr = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
        state[key] = np.ascontiguousarray(arr, dtype=np.float32)
    return state


def demo_arrays(layout: str = "mediapipe", strategy: str = "spatial", num_class: int = 2,
                two_stream: bool = True, seed: int = 0, edge_importance: bool = True,
                widths: Sequence[int] = WIDTHS) -> dict[str, np.ndarray]:
    """An original-format (two-stream or single-stream) state as numpy arrays; `widths`
    other than the original's make the tests' narrow network."""
    rng = np.random.default_rng(seed)
    a = adjacency(layout, strategy)
    keys = stream_state_layout(a.shape[0], a.shape[1], num_class, 3, edge_importance, widths)
    state: dict[str, np.ndarray] = {}
    for prefix in ("origin_stream.", "motion_stream.") if two_stream else ("",):
        state.update({prefix + k: v for k, v in random_stream_arrays(a, keys, rng).items()})
    return state


def spec_arrays(spec: Any) -> dict[str, np.ndarray]:
    """The demo weights a ModelSpec without checkpoint stands for."""
    return demo_arrays(spec.layout, spec.strategy, spec.num_class, spec.two_stream,
                       seed=spec.seed)


def demo_state_dict(layout: str = "mediapipe", strategy: str = "spatial", num_class: int = 2,
                    two_stream: bool = True, seed: int = 0, edge_importance: bool = True,
                    widths: Sequence[int] = WIDTHS) -> dict[str, torch.Tensor]:
    """`demo_arrays` as a PyTorch state_dict (needs torch)."""
    import torch

    arrays = demo_arrays(layout, strategy, num_class, two_stream, seed, edge_importance, widths)
    return {k: torch.from_numpy(v.copy()) if v.ndim else torch.tensor(int(v), dtype=torch.long)
            for k, v in arrays.items()}
