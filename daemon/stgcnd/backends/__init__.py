"""Inference runtimes behind one contract (base.py): TensorRT, PyTorch, ONNX Runtime.

    from stgcnd.backends import open_backend, available_backends

Names are imported lazily: importing this package imports neither torch nor tensorrt.
"""

from __future__ import annotations

from typing import Any

from stgcnd.backends.base import Backend, BackendInfo, Session

__all__ = ["Backend", "BackendInfo", "Session", "available_backends", "open_backend"]


def __getattr__(name: str) -> Any:
    if name in ("open_backend", "available_backends"):
        from stgcnd.backends import registry

        return getattr(registry, name)
    raise AttributeError(name)
