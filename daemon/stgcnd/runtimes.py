"""The optional inference runtimes, imported in one place with errors that say how to get them.

Torch-free on purpose: the TensorRT serving path imports this and must not pay for torch.
"""

from __future__ import annotations

from typing import Any

from stgcnd.errors import BackendUnavailable


def import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise BackendUnavailable("onnxruntime is not installed; pip install "
                                 "'stgcnd[onnxruntime]' (or onnxruntime-gpu for CUDA)") from None
    return onnxruntime


def import_tensorrt() -> Any:
    """The `tensorrt` module; any release (callers check the API they need)."""
    try:
        import tensorrt
    except ImportError as exc:
        raise BackendUnavailable(
            f"tensorrt is not importable ({exc}); on a Jetson use a venv made with "
            "--system-site-packages so that JetPack's tensorrt is visible") from None
    return tensorrt
