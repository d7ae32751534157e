"""Load a model and compute its reference logits, with or without torch installed.

torch is an optional extra (`pip install -e ".[torch]"`): it is needed for a user's
checkpoint and the torch backend, not for the demo model, whose weights are numpy and whose
ONNX graph is built without torch. Nothing here imports torch unless it is used.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from stgcnd.errors import BackendUnavailable

TORCH_EXTRA = 'pip install -e ".[torch]" (or pip install "stgcnd[torch]")'


def torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def torch_missing(what: str) -> BackendUnavailable:
    """The error for a feature that needs torch when it is not installed."""
    return BackendUnavailable(f"{what} needs PyTorch, which is not installed: {TORCH_EXTRA}")


def load_for_inference(spec: Any) -> Any:
    """A LoadedModel (torch) when torch is installed; without torch, the demo model's numpy
    stand-in; a checkpoint without torch is a BackendUnavailable that says what to install."""
    if torch_installed():
        from stgcnd.model.loader import load_model

        return load_model(spec)
    if spec.is_demo:
        from stgcnd.model.numpy_demo import load_numpy_demo

        return load_numpy_demo(spec)
    raise torch_missing(f"loading the PyTorch checkpoint {spec.checkpoint}")


def reference_logits(model: Any, windows: Any, batch: int = 16) -> Any:
    """fp32 logits of windows (N, 3, T, V, M) by the model's reference: PyTorch on the CPU for a
    LoadedModel, the numpy forward for the numpy demo model."""
    own = getattr(model, "reference_logits", None)
    if own is not None:
        return own(windows)
    from stgcnd.model.loader import reference_logits as torch_reference

    return torch_reference(model, windows, batch)
