"""What a model is, as the user configures it: everything needed to rebuild it exactly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stgcnd.errors import CheckpointError
from stgcnd.model.layouts import LAYOUTS, STRATEGIES

DEMO_SEED = 20261122
# Here rather than in stgcn.py so that code which must not import torch (the TensorRT serving
# path, the CLI's argument parsing) can use them.
MOTION_FORMULAS: tuple[str, ...] = ("first-difference", "second-difference")
GRAPH_OPS: tuple[str, ...] = ("einsum", "matmul")
DEFAULT_GRAPH_OP = "matmul"


def default_labels(num_class: int) -> tuple[str, ...]:
    """Names for classes the user did not name."""
    if num_class == 2:
        return ("normal", "abnormal")
    return tuple(f"class_{i}" for i in range(num_class))


def check_labels(labels: Sequence[str], classes: int, source: str) -> None:
    """The one check of the configured labels against the class count the model itself has
    (a checkpoint's classifier, an ONNX graph's output, a TensorRT engine's output binding),
    made on every runtime: a label per class, or predictions are named wrongly."""
    if labels and len(labels) != classes:
        raise CheckpointError(
            f"{source} has {classes} classes but {len(labels)} labels were given "
            f"({', '.join(labels)}); give exactly {classes} (labels = [...] in the model's "
            f"section, one name per class in class order), or serve the model trained with "
            f"{len(labels)} classes")


@dataclass(frozen=True)
class ModelSpec:
    """A model's identity. `checkpoint=None` means the seeded demo model (meaningless output)."""

    # A str is taken too (made a Path by __post_init__).
    checkpoint: Path | str | None = None
    layout: str = "mediapipe"
    persons: int = 1
    frames: int = 150
    motion: str = "first-difference"
    labels: tuple[str, ...] = ()
    # Only used when there is no checkpoint (the demo model); a checkpoint decides these.
    strategy: str = "spatial"
    num_class: int = 2
    two_stream: bool = True
    seed: int = DEMO_SEED
    # How the graph step is written in the exported graph: matmul, which ONNX Runtime's CPU
    # kernels ran faster than einsum when it was chosen.
    graph_op: str = DEFAULT_GRAPH_OP
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; choose one of {', '.join(LAYOUTS)}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of "
                             f"{', '.join(STRATEGIES)}")
        if self.motion not in MOTION_FORMULAS:
            raise ValueError(f"unknown motion formula {self.motion!r}; choose one of "
                             f"{', '.join(MOTION_FORMULAS)}")
        if self.graph_op not in GRAPH_OPS:
            raise ValueError(f"unknown graph op {self.graph_op!r}; choose one of "
                             f"{', '.join(GRAPH_OPS)}")
        if self.persons < 1:
            raise ValueError(f"persons must be >= 1, got {self.persons}")
        if self.frames < 3:
            raise ValueError(f"frames must be >= 3, got {self.frames}")
        if self.checkpoint is not None and not isinstance(self.checkpoint, Path):
            object.__setattr__(self, "checkpoint", Path(self.checkpoint))
        object.__setattr__(self, "labels", tuple(self.labels))

    @property
    def is_demo(self) -> bool:
        return self.checkpoint is None

    @property
    def num_node(self) -> int:
        return LAYOUTS[self.layout].num_node

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        """One window, without the batch dimension: (C, T, V, M)."""
        return (3, self.frames, self.num_node, self.persons)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        d["checkpoint"] = str(self.checkpoint) if self.checkpoint else None
        d["labels"] = list(self.labels)
        return d
