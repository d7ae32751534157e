"""One builder per backend: what it writes into the engine store, and for which environment."""

from __future__ import annotations

from types import ModuleType

from stgcnd.engines.builders.base import BuildContext, Builder
from stgcnd.errors import UserError

__all__ = ["BuildContext", "Builder", "build_steps", "get_builder"]


def get_builder(backend: str) -> Builder:
    if backend == "onnxruntime":
        from stgcnd.engines.builders.onnxruntime import OnnxRuntimeBuilder

        return OnnxRuntimeBuilder()
    if backend == "torch":
        from stgcnd.engines.builders.torch import TorchBuilder

        return TorchBuilder()
    if backend == "tensorrt":
        from stgcnd.engines.builders.tensorrt import TensorRTBuilder

        return TensorRTBuilder()
    raise UserError(f"unknown backend {backend!r}; the engine store builds for tensorrt, torch "
                    "or onnxruntime (resolve 'auto' first)")


def build_steps() -> ModuleType:
    """stgcnd.engines.builders.steps (the ONNX exported, quantized, the build validated),
    imported now: only a store that builds in this process pays for it."""
    from stgcnd.engines.builders import steps

    return steps
