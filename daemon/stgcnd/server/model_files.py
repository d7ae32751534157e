"""What `config check` reads from a model's files without loading the model: the class count
of an exported .onnx (its graph's output) and of a .pt checkpoint (with torch), against the
configured labels. Not loaded by `serve`, which checks the artefact itself when it loads
(server/models.py) and must not import onnx or torch for it before."""

from __future__ import annotations

from pathlib import Path

from stgcnd.errors import UserError
from stgcnd.export.onnx_export import output_classes
from stgcnd.model.reference import checkpoint_num_class, torch_installed
from stgcnd.model.spec import ModelSpec, check_labels
from stgcnd.server.config import ModelConfig


def labels_problems(mc: ModelConfig) -> list[str]:
    """The labels against the class count the checkpoint's file has, where it can be read."""
    if not mc.labels or mc.checkpoint is None:
        return []
    path = Path(mc.checkpoint)
    try:  # a file that does not read is loading's to report (it says how to fix it)
        if path.suffix.lower() == ".onnx":
            classes = output_classes(path)
        elif torch_installed():
            classes = checkpoint_num_class(ModelSpec(checkpoint=path))
        else:
            return []
    except UserError:
        return []
    try:
        if classes is not None:
            check_labels(mc.labels, classes, str(path))
    except UserError as exc:
        return [str(exc)]
    return []
