"""Load a model and compute its reference logits, with or without torch installed.

torch is an optional extra (`pip install -e ".[torch]"`): it is needed for a user's
checkpoint and the torch backend, not for the demo model, whose weights are numpy and whose
ONNX graph is built without torch. Nothing here imports torch unless it is used.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from stgcnd import versions
from stgcnd.errors import BackendUnavailable


def torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def torch_missing(what: str) -> BackendUnavailable:
    """The error for a feature that needs torch when it is not installed."""
    return BackendUnavailable(versions.torch_missing(what))


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


def export_module(model: Any) -> Any:
    """The network to export to ONNX: inference-optimized (BatchNorm folded), torch."""
    from stgcnd.model.optimized import optimize_for_export

    return optimize_for_export(model)


def checkpoint_num_class(spec: Any) -> int | None:
    """The checkpoint's class count (one state_dict read, no network built), or None when
    there is no checkpoint or no torch to read it. A checkpoint that cannot be read is an
    error (CheckpointError says why)."""
    if spec.checkpoint is None or not torch_installed():
        return None
    from stgcnd.model.checkpoint import inspect_state_dict, read_state_dict

    state = read_state_dict(spec.checkpoint)
    return int(inspect_state_dict(state, str(spec.checkpoint)).num_class)


def gflop_per_window(model: Any, window: Any) -> float | None:
    """GFLOP of one window (C, T, V, M) through the PyTorch network, counted by torch's
    FlopCounterMode (2 a multiply-add); None where it cannot count: torch < 2.1, or the numpy
    demo model."""
    module = getattr(model, "module", None)
    if module is None or not torch_installed():
        return None
    import torch

    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(torch.from_numpy(window[None].astype("float32")))
    return float(counter.get_total_flops()) / 1e9
