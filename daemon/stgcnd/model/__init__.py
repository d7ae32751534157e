"""The ST-GCN network, its graphs, checkpoints and the demo model.

Importing the package does not import torch: `load_model` gives a PyTorch LoadedModel where
torch is installed, the demo model's numpy stand-in where it is not (model/reference.py).
"""

from __future__ import annotations

from stgcnd.model.reference import load_for_inference as load_model
from stgcnd.model.reference import reference_logits
from stgcnd.model.spec import ModelSpec

__all__ = ["ModelSpec", "load_model", "reference_logits"]
