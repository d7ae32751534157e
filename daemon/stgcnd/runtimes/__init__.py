"""Inference runtimes behind one contract (base.py): TensorRT, PyTorch, ONNX Runtime, noop.

The optional heavy libraries (torch, tensorrt, onnxruntime) are imported here and only here,
when first asked for, with an error that says how to get them: `stgcnd --help`, the client and
a daemon serving TensorRT never pay for torch. `available()` says what can run on this machine
without importing anything heavy.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

from stgcnd.errors import BackendUnavailable
from stgcnd.fsutil import read_system_file
from stgcnd.runtimes.cuda import device_properties
from stgcnd.versions import torch_missing, torch_unusable

NAMES = ("tensorrt", "torch", "onnxruntime", "noop")
# The module of each runtime, imported by runtime_module() alone.
_MODULES = {"tensorrt": "stgcnd.runtimes.tensorrt_runtime",
            "torch": "stgcnd.runtimes.torch_runtime",
            "onnxruntime": "stgcnd.runtimes.onnxruntime_runtime",
            "noop": "stgcnd.runtimes.noop"}


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def gpu_present() -> bool:
    """A CUDA GPU answers the driver (no torch needed; a Jetson's iGPU included)."""
    return device_properties() is not None


def cpu_bf16() -> str | None:
    """The CPU's native bf16 instructions (amx_bf16, avx512_bf16, or Arm's bf16), or None:
    where the torch runtime's CPU bf16 pays (emulated, it runs slower than fp32)."""
    flags: set[str] = set()
    for line in (read_system_file(Path("/proc/cpuinfo")) or "").splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.split(":", 1)[1].split())
    return next((f for f in ("amx_bf16", "avx512_bf16", "bf16") if f in flags), None)


def available() -> dict[str, str | None]:
    """Runtime name -> None when it can run here, else why not (and the fix)."""
    out: dict[str, str | None] = {}
    if not importable("tensorrt"):
        out["tensorrt"] = ("tensorrt is not importable (on a Jetson: a venv with "
                           "--system-site-packages sees JetPack's tensorrt)")
    elif not gpu_present():
        out["tensorrt"] = "no CUDA GPU answers the driver"
    else:
        out["tensorrt"] = None
    out["torch"] = torch_unusable() if importable("torch") else \
        torch_missing("the torch runtime")
    out["onnxruntime"] = (None if importable("onnxruntime")
                          else "onnxruntime is not installed (pip install onnxruntime)")
    out["noop"] = None  # numpy only; never chosen by "auto" (it computes nothing)
    return out


def runtime_module(name: str) -> ModuleType:
    """The module of runtime `name`, imported now (it imports its library)."""
    if name not in _MODULES:
        raise BackendUnavailable(f"unknown runtime {name!r}; choose one of {', '.join(NAMES)}")
    try:
        return importlib.import_module(_MODULES[name])
    except ImportError as exc:
        reason = available().get(name) or str(exc)
        raise BackendUnavailable(f"the {name} runtime cannot run here: {reason}") from None


def import_torch() -> ModuleType:
    """The `torch` module, or BackendUnavailable saying how to install it."""
    reason = available()["torch"]
    if reason is not None:
        raise BackendUnavailable(reason)
    return importlib.import_module("torch")


def import_onnxruntime() -> ModuleType:
    try:
        return importlib.import_module("onnxruntime")
    except ImportError:
        raise BackendUnavailable("onnxruntime is not installed; pip install "
                                 "'stgcnd[onnxruntime]' (or onnxruntime-gpu for CUDA)") from None


def import_tensorrt() -> ModuleType:
    """The `tensorrt` module; any release (callers check the API they need)."""
    try:
        return importlib.import_module("tensorrt")
    except ImportError as exc:
        raise BackendUnavailable(
            f"tensorrt is not importable ({exc}); on a Jetson use a venv made with "
            "--system-site-packages so that JetPack's tensorrt is visible") from None


def torch_cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA GPU (imports torch)."""
    try:
        return bool(import_torch().cuda.is_available())
    except BackendUnavailable:
        return False
