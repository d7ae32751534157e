"""The ST-GCN network, its graphs, checkpoints and the demo model.

Names are imported lazily so that light users (CLI argument parsing, the graph module) do not
pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stgcnd.model.loader import LoadedModel, load_model, reference_logits
    from stgcnd.model.spec import ModelSpec

__all__ = ["LoadedModel", "ModelSpec", "load_model", "reference_logits"]


def __getattr__(name: str) -> Any:
    if name == "reference_logits":  # dispatches: PyTorch, or numpy for the torch-free demo
        from stgcnd.model.reference import reference_logits

        return reference_logits
    if name in ("LoadedModel", "load_model"):
        from stgcnd.model.reference import torch_installed, torch_missing

        if not torch_installed():
            if name == "load_model":  # the demo model without torch; else the fix in one line
                from stgcnd.model.reference import load_for_inference

                return load_for_inference
            raise torch_missing("a PyTorch network")
        from stgcnd.model import loader

        return getattr(loader, name)
    if name == "ModelSpec":
        from stgcnd.model.spec import ModelSpec

        return ModelSpec
    raise AttributeError(name)
