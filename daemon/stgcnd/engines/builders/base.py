"""The builder interface the engine store drives."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.engines.options import BuildOptions
from stgcnd.runtimes.base import Runtime


def device_identity(device: str) -> dict[str, Any]:
    """The device part of a cache key: 'cpu' -> the CPU architecture; 'cuda' -> GPU + Jetson
    too (engines/device.py: loaded for a CUDA device only, a CPU's serve never needs it)."""
    ident: dict[str, Any] = {"kind": device, "machine": platform.machine()}
    if device == "cuda":
        from stgcnd.engines.device import cuda_identity
        ident.update(cuda_identity())
    return ident


@dataclass
class BuildContext:
    """Everything a build needs; paths are inside the store."""

    model: Any                       # LoadedModel
    options: BuildOptions
    onnx_path: Path                  # the fp32 ONNX (static or dynamic batch, per options)
    qdq_onnx_path: Path | None       # the Q/DQ INT8 ONNX when the build needs one
    model_dir: Path
    store_root: Path
    calibration: np.ndarray | None = None   # windows, for TensorRT's implicit calibration
    calibration_info: dict[str, Any] = field(default_factory=dict)


class Builder:
    """Subclasses set `name` and `suffix` (None: the artefact is its manifest alone)."""

    name: str = ""
    suffix: str | None = None

    def device_kind(self, options: BuildOptions) -> str:
        return options.device

    def version(self) -> str | None:
        """The runtime's version (part of the key); raises BackendUnavailable if missing."""
        raise NotImplementedError

    def environment(self, options: BuildOptions) -> dict[str, Any]:
        return {"backend_version": self.version(),
                "device": device_identity(self.device_kind(options)),
                "runtime": {}}  # TensorRT's own: builders/tensorrt.py

    def check(self, options: BuildOptions) -> None:
        """Raise UserError if `options` cannot be built here, saying what would make it work."""

    def needs_qdq(self, options: BuildOptions) -> bool:
        return options.precision == "int8"

    def build(self, ctx: BuildContext, out: Path) -> dict[str, Any]:
        """Write the artefact to `out` (a temp path); return what to record in the manifest."""
        raise NotImplementedError

    def open(self, artifact: Any, options: BuildOptions, model: Any, cache: Path) -> Runtime:
        """The runtime that serves `artifact` (an engines.store.Artifact) with `options`: the
        one loader, used by the daemon (provision.load_runtime) and by the store's validation,
        so that what is validated is what serves (TensorRT's CUDA graphs, torch's compiled
        kernels). `model`: the loaded model (torch runs it; the others read the manifest);
        `cache`: the store's root (torch.compile's cache)."""
        raise NotImplementedError
