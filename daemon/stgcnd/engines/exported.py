"""A model known by its exported ONNX alone: serving a checkpoint on a board without torch.

The store stands the ONNX graph and its JSON sidecar in for the loaded model, with ONNX
Runtime's fp32 output as the reference. A model's store directory is keyed by its
checkpoint's sha256, never its path, so a store built elsewhere is found on the board.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.errors import UserError
from stgcnd.export import INPUT_NAME, OUTPUT_NAME
from stgcnd.fsutil import file_sha256
from stgcnd.model.spec import ModelSpec
from stgcnd.runtimes import runtime_module

ONNX_SUFFIX = ".onnx"


def sidecar_path(onnx_path: Path) -> Path:
    """Where `stgcnd export` writes an ONNX file's JSON sidecar."""
    return onnx_path.with_name(onnx_path.name + ".json")


def read_sidecar(onnx_path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(sidecar_path(onnx_path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_onnx_checkpoint(spec: ModelSpec) -> bool:
    return spec.checkpoint is not None and Path(spec.checkpoint).suffix.lower() == ONNX_SUFFIX


def checkpoint_sha256(spec: ModelSpec) -> str | None:
    """The sha256 of the PyTorch checkpoint behind `spec` (None for the demo model). For an
    exported .onnx given as the checkpoint, the one its sidecar records."""
    if spec.checkpoint is None:
        return None
    path = Path(spec.checkpoint).expanduser()
    if is_onnx_checkpoint(spec):
        sidecar = read_sidecar(path)
        if sidecar is None or not sidecar.get("checkpoint_sha256"):
            raise UserError(
                f"{path} has no readable sidecar {sidecar_path(path).name} (written by "
                "`stgcnd export` next to the .onnx): copy it along with the .onnx file, or "
                "export again with `stgcnd export --checkpoint model.pt --output "
                f"{path.name}`")
        return str(sidecar["checkpoint_sha256"])
    try:
        return file_sha256(path)
    except OSError as exc:
        raise UserError(f"cannot read checkpoint {path}: {exc.strerror}") from None


def check_matches(spec: ModelSpec, sidecar: dict[str, Any], where: Path) -> None:
    """The exported graph must be of the configured shape and motion formula."""
    for key in ("layout", "persons", "frames", "motion"):
        want, have = getattr(spec, key), sidecar.get(key)
        if have != want:
            raise UserError(f"{where} was exported with {key} = {have!r}, the configuration "
                            f"says {want!r}: set {key} = {have!r} in the model's section, or "
                            "export again with the configured value")


@dataclass(frozen=True)
class ExportedModel:
    """The loaded-model stand-in of a checkpoint known by its exported ONNX (no torch)."""

    spec: ModelSpec
    onnx_path: Path
    num_class: int
    labels: tuple[str, ...]
    checkpoint_sha256: str | None
    adjacency_fingerprint: str | None
    dynamic_batch: bool
    module: None = None  # no network: it cannot be exported again, only served and built

    @classmethod
    def from_onnx(cls, spec: ModelSpec, onnx_path: Path) -> ExportedModel:
        sidecar = read_sidecar(onnx_path)
        if sidecar is None:
            raise UserError(f"{onnx_path} has no readable sidecar; export it again")
        check_matches(spec, sidecar, onnx_path)
        labels = tuple(spec.labels) or tuple(str(x) for x in sidecar.get("labels") or ())
        return cls(spec, onnx_path, int(sidecar["num_class"]), labels,
                   sidecar.get("checkpoint_sha256"), sidecar.get("adjacency_fingerprint"),
                   bool(sidecar.get("dynamic_batch")))

    def describe(self) -> dict[str, Any]:
        return {"source": "exported ONNX", "onnx": str(self.onnx_path)}

    def reference_logits(self, windows: np.ndarray) -> np.ndarray:
        """fp32 logits of ONNX Runtime on the CPU: the reference where torch is absent."""
        session = runtime_module("onnxruntime").ort_session(self.onnx_path)
        x = np.ascontiguousarray(windows, dtype=np.float32)
        if self.dynamic_batch:
            return np.asarray(session.run([OUTPUT_NAME], {INPUT_NAME: x})[0])
        return np.concatenate([session.run([OUTPUT_NAME], {INPUT_NAME: w[None]})[0]
                               for w in x])
