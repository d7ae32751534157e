"""The engine store: build once per (model, backend, precision, device), reuse on every start.

Looking up what is stored is engines/stored.py's; making it (export, build, the failure
records, the build child) and the inventory (`list`, `prune`) are engines/build.py's,
imported only when asked for: a warm start never loads them. The layout is the comment above
StoreLookup.
"""

from __future__ import annotations

import builtins
from pathlib import Path
from types import ModuleType
from typing import Any

from stgcnd.engines.builders import get_builder
from stgcnd.engines.exported import ExportedModel, checkpoint_sha256, is_onnx_checkpoint
from stgcnd.engines.options import BACKENDS, BuildOptions
from stgcnd.engines.stored import BUILT_HERE, Artifact, StoreLookup, is_loaded_model
from stgcnd.errors import BuildCancelled, UserError

__all__ = ["BUILT_HERE", "Artifact", "EngineStore"]


def _build() -> ModuleType:
    """stgcnd.engines.build, imported now: only a store that must make something pays."""
    from stgcnd.engines import build

    return build


class EngineStore(StoreLookup):
    def prepare(self, model: Any, backend: str, options: BuildOptions | None = None, *,
                rebuild: str | None = None, validate: bool = True) -> Artifact:
        """Export/re-export the ONNX and build or reuse the artefact; returns it.

        `model` is a LoadedModel, or a ModelSpec (loaded only if something must be built).
        `rebuild` forces a rebuild and is logged as its reason, e.g. when the backend failed
        to load the stored artefact ("failed to load: incompatible device").
        """
        if backend not in BACKENDS:
            raise UserError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        builder = get_builder(backend)
        options = self.resolve_options(options or BuildOptions())
        builder.check(options)
        spec = model.spec if is_loaded_model(model) else model
        if self.cancel is not None and self.cancel.is_set():
            raise BuildCancelled("cancelled before the engine store was asked")
        if rebuild is None:
            found = self.find(spec, backend, options, model=model)
            if found is not None:
                return found
        return _build().prepare(self, model, spec, builder, options, rebuild, validate)

    def export(self, model: Any, dynamic_batch: bool) -> Path:
        """Export (or keep) the model's ONNX in the store, building nothing from it: what a
        board whose engine is built there needs from a workstation (`build --platform`)."""
        return _build().export(self, model, dynamic_batch)

    def list(self) -> list[dict[str, Any]]:
        """Every manifest in the store, with whether it still matches this machine."""
        return _build().inventory(self)

    def prune(self, dry_run: bool = False) -> builtins.list[dict[str, Any]]:
        """Remove what can never be used again here; returns [{path, reason}]: leftovers of
        killed builds; artefacts whose file is missing or does not match its manifest, or
        built for another backend version or device (kept when that backend is not installed
        here: the store may be on its way to another device)."""
        return _build().prune(self, dry_run)

    def load(self, spec: Any, dynamic_batch: bool) -> Any:
        """The model to build from: loaded by torch; without torch (or for an .onnx given as
        the checkpoint) its exported ONNX stands in (engines/exported.py); the demo model
        without torch is its numpy stand-in. The loader is imported here: a warm start of an
        exported artefact (ONNX Runtime, TensorRT) never loads the model."""
        from stgcnd.model.reference import load_for_inference, torch_installed, torch_missing

        if spec.is_demo or (torch_installed() and not is_onnx_checkpoint(spec)):
            return load_for_inference(spec)
        mdir = self.model_dir(spec)
        path = self.onnx_path(mdir, dynamic_batch)
        sha = checkpoint_sha256(spec)
        if is_onnx_checkpoint(spec) and self.onnx_stale_reason(spec, sha, path) is not None:
            _build().import_onnx(self, spec, Path(spec.checkpoint).expanduser(), mdir,
                                 dynamic_batch)
        if self.onnx_stale_reason(spec, sha, path) is None:
            return ExportedModel.from_onnx(spec, path)
        # Only routes that work for this configuration: `export` makes a dynamic batch by
        # default (a batch-1 export needs --static-batch), and a copied store holds this
        # export only when `build --config` prepared it (a plain `build` makes batch 1).
        name = Path(spec.checkpoint).name
        flags = "".join(f" --{flag} {value}" for flag, value, default in (
            ("layout", spec.layout, "mediapipe"), ("persons", spec.persons, 1),
            ("frames", spec.frames, 150), ("motion", spec.motion, "first-difference"))
            if value != default) + ("" if dynamic_batch else " --static-batch")
        raise torch_missing(
            f"loading the PyTorch checkpoint {spec.checkpoint}; or, without torch here, "
            f"export it where torch is (`stgcnd export --checkpoint {name}{flags} --output "
            "model.onnx`), copy the .onnx and its .onnx.json here and set checkpoint = "
            "\"/path/model.onnx\"; or prepare an engine store there with `stgcnd build "
            "--config` on this configuration (add --platform jetson when this is a Jetson) "
            f"and copy that store here along with {name}")
