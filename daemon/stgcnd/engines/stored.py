"""What the engine store holds, and whether it is current: looked up without building.

A warm start only looks up and opens (this module); making an artefact is engines/build.py's,
imported by the store (engines/store.py) only when something must be made. A manifest is
trusted only when the artefact's size and sha256 match it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stgcnd.engines.builders import Builder, build_steps, get_builder
from stgcnd.engines.exported import checkpoint_sha256, sidecar_path
from stgcnd.engines.keys import describe_key_change, key_digest, make_key_parts
from stgcnd.engines.lock import build_lock
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.retry import BuildRetry
from stgcnd.errors import UserError
from stgcnd.fsutil import file_sha256
from stgcnd.log import get_logger
from stgcnd.model.spec import DEFAULT_GRAPH_OP

log = get_logger(__name__)

MANIFEST_FORMAT = "stgcnd-engine-manifest/1"
MODEL_FORMAT = "stgcnd-store-model/1"
EXPORT_VARIANT = "optimized"
# The demo model's graph is built from its numpy weights (stgcnd.export.demo_onnx), with or
# without torch, so that every machine makes the same demo ONNX; its own variant keeps it apart
# from the PyTorch export of the same weights in the export key.
DEMO_EXPORT_VARIANT = "numpy-demo"
# The reason of a reused artefact that this store built earlier in the same run.
BUILT_HERE = "built earlier in this run"


@dataclass
class Artifact:
    backend: str
    precision: str
    path: Path | None           # None: the artefact is its manifest alone (torch)
    onnx_path: Path
    manifest: dict[str, Any]
    reused: bool
    reason: str | None          # why it was (re)built; None when reused
    manifest_path: Path | None = None


def is_loaded_model(obj: Any) -> bool:
    return hasattr(obj, "module") and hasattr(obj, "spec")


def model_id(spec: Any) -> str:
    """Directory name of a model: readable stem + hash of its source and input shape. A
    checkpoint counts by its content (sha256), not its path: a store built on a workstation
    is found on the board, and a copied or renamed checkpoint keeps its engines."""
    if spec.checkpoint is None:
        source: dict[str, Any] = {"demo": {"seed": spec.seed, "num_class": spec.num_class,
                                           "strategy": spec.strategy,
                                           "two_stream": spec.two_stream}}
        stem = "demo"
    else:
        source = {"checkpoint_sha256": checkpoint_sha256(spec)}
        stem = Path(spec.checkpoint).stem
    ident = {**source, "layout": spec.layout, "persons": spec.persons, "frames": spec.frames}
    if spec.graph_op != DEFAULT_GRAPH_OP:
        # Another form of the graph (bench's baseline rows ask for einsum) is a model of its
        # own: exported into the served model's directory it would replace the ONNX that the
        # served artefacts were built from, and the next start would rebuild (re-tune) them.
        ident["graph_op"] = spec.graph_op
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.")[:40] or "model"
    return f"{slug}-{key_digest(ident)[:10]}"


def export_key(spec: Any, checkpoint_sha256: str | None, dynamic_batch: bool) -> dict[str, Any]:
    """What the exported ONNX depends on; any change re-exports it."""
    return {"checkpoint_sha256": checkpoint_sha256,
            "demo_seed": spec.seed if spec.checkpoint is None else None,
            "layout": spec.layout, "persons": spec.persons, "frames": spec.frames,
            "motion": spec.motion, "graph_op": spec.graph_op, "dynamic_batch": dynamic_batch,
            "variant": DEMO_EXPORT_VARIANT if spec.checkpoint is None else EXPORT_VARIANT}


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def onnx_sha(path: Path) -> str:
    """The sha256 of a stored ONNX, as its sidecar records it."""
    return str((read_json(sidecar_path(path)) or {}).get("onnx_sha256"))


# Layout under the root (the caller says where: the daemon's `engines_dir`, a command's
# --engines, else $STGCND_ENGINE_DIR or the default in server/config.py):
#
#     <model-id>/model.json                       what the model is (for `stgcnd engines list`)
#     <model-id>/onnx/model-b1.onnx (+ .json)     exported fp32 ONNX, static batch 1
#     <model-id>/onnx/model-dynamic.onnx          ... with a dynamic batch axis
#     <model-id>/onnx/model-b1.int8-<calib>.onnx  Q/DQ INT8 ONNX per calibration data set
#     <model-id>/<backend>-<precision>-<device>-<batch>.<ext>   the artefact
#     <model-id>/<backend>-<precision>-<device>-<batch>.json    its manifest (key, validation)
#     <model-id>/.locks/                           flock files, one per artefact / ONNX
#     timing-cache/tensorrt-<version>-<device>.cache           TensorRT timing caches
#
# The model id names the model's input and source (the checkpoint's content or the demo,
# layout, persons, frames, a graph op other than the default), so several configured models
# live side by side; the export settings are in the ONNX's key too.
class StoreLookup:
    def __init__(self, root: Path | str, cancel: threading.Event | None = None,
                 retry: BuildRetry | None = None) -> None:
        """`cancel`: builds run in a child process that is killed, and its partial files
        removed, as soon as the event is set (`BuildCancelled`; engines/child_build.py).
        `retry`: when a failed build is tried again (engines/retry.py)."""
        self.root = Path(root)
        self.cancel = cancel
        self.retry = retry or BuildRetry()
        # Manifests this store built: asked again (auto measures, then serves), the artefact
        # is reused with the reason BUILT_HERE, which commands show as built, not as reused.
        self.built_here: set[Path] = set()
        # backend auto on a CPU: measure again rather than read auto-backend.json (a choice
        # measured on a busy machine would otherwise stay): `stgcnd build --rebuild`.
        self.remeasure_auto = False

    def model_dir(self, spec: Any) -> Path:
        """The model's directory; one found under another name (a copied store whose
        checkpoint is called differently here) is the same model: the name's hash is its
        identity, the stem before it only a reminder."""
        name = model_id(spec)
        digest = name.rsplit("-", 1)[1]
        if not (self.root / name).is_dir():
            for other in sorted(self.root.glob(f"*-{digest}")):
                if other.is_dir():
                    return other
        return self.root / name

    @staticmethod
    def onnx_path(model_dir: Path, dynamic_batch: bool) -> Path:
        return model_dir / "onnx" / ("model-dynamic.onnx" if dynamic_batch else "model-b1.onnx")

    @staticmethod
    def artifact_stem(backend: str, options: BuildOptions, device: str) -> str:
        return f"{backend}-{options.precision}-{device}-{options.batch_tag}"

    def load(self, spec: Any, dynamic_batch: bool) -> Any:
        """The model to build from (EngineStore.load)."""
        raise NotImplementedError

    def find(self, spec: Any, backend: str, options: BuildOptions | None = None,
             quiet: bool = False, model: Any = None) -> Artifact | None:
        """The stored artefact if it is current, without loading the model (no torch).

        `quiet`: no engine_reused line (the caller logs what happened itself). `model`: the
        loaded model when the caller has it (its checkpoint's sha256 is known)."""
        builder = get_builder(backend)
        options = self.resolve_options(options or BuildOptions())
        mdir = self.model_dir(spec)
        stem = self.artifact_stem(backend, options, builder.device_kind(options))
        if not (mdir / f"{stem}.json").exists():
            return None
        with build_lock(mdir / ".locks" / f"{stem}.lock", stem):
            found = self.current(spec, model or spec, builder, options,
                                 builder.environment(options), mdir, stem, quiet=quiet)
        return found if isinstance(found, Artifact) else None

    def resolve_options(self, options: BuildOptions) -> BuildOptions:
        """Fill in the calibration data's sha256 (the key uses the data, not the path)."""
        if options.precision != "int8":
            return options
        if options.calibration is None:
            if not options.allow_synthetic_calibration:
                # Also when a synthetically calibrated artefact is stored: reusing it must be
                # asked for as explicitly as building it.
                build_steps().refuse_without_calibration()
            return options
        path = Path(options.calibration)
        if not path.is_file():
            raise UserError(f"calibration file {path} does not exist; record windows to an "
                            ".npz/.npy or pass --allow-synthetic-calibration")
        return dataclasses.replace(options, extra={**options.extra,
                                                   "calibration_sha256": file_sha256(path)})

    def onnx_stale_reason(self, spec: Any, checkpoint_sha: str | None, path: Path
                          ) -> str | None:
        sidecar = read_json(sidecar_path(path))
        if sidecar is None or not path.exists():
            return "missing"
        want = export_key(spec, checkpoint_sha, sidecar.get("dynamic_batch", False))
        have = sidecar.get("store_export_key")
        if have != want:
            changes = describe_key_change(have or {}, want)
            return "export key changed: " + "; ".join(changes)
        if path.stat().st_size != sidecar.get("store_size_bytes"):
            return "corrupt: size differs from its sidecar"
        # A same-size change (a flipped byte) only shows in the content: hashing the ONNX
        # costs ~10 ms per 10 MB, once per start or reload, never per request.
        if file_sha256(path) != sidecar.get("onnx_sha256"):
            return "corrupt: sha256 differs from its sidecar"
        return None

    def key_parts(self, spec: Any, builder: Builder, options: BuildOptions,
                  env: dict[str, Any], onnx_path: Path) -> dict[str, Any]:
        return make_key_parts(
            onnx_sha256=onnx_sha(onnx_path), backend=builder.name,
            backend_version=env["backend_version"], device=env["device"],
            options=options.key_dict(builder.name), input_shape=list(spec.input_shape),
            batch_range=[1, options.max_batch], runtime=env.get("runtime"))

    def stale_reason(self, mdir: Path, stem: str, builder: Builder,
                     parts: dict[str, Any]) -> str | None:
        manifest = read_json(mdir / f"{stem}.json")
        art = mdir / f"{stem}{builder.suffix}" if builder.suffix else None
        if manifest is None and (mdir / f"{stem}.json").exists():
            return "corrupt: manifest unreadable"
        if manifest is None or (art is not None and not art.exists()):
            return "missing"
        if manifest.get("key") != key_digest(parts):
            return "key changed: " + "; ".join(
                describe_key_change(manifest.get("key_parts") or {}, parts))
        if art is None:
            return None
        size = art.stat().st_size
        if size != manifest.get("size_bytes"):
            return (f"failed to load: corrupt (size {size} bytes, manifest says "
                    f"{manifest.get('size_bytes')}; truncated?)")
        if file_sha256(art) != manifest.get("sha256"):
            return "failed to load: corrupt (sha256 differs from the manifest)"
        return None

    def current(self, spec: Any, model: Any, builder: Builder, options: BuildOptions,
                env: dict[str, Any], mdir: Path, stem: str, quiet: bool = False
                ) -> Artifact | str:
        """The artefact if ONNX and artefact are current (no torch needed), else why not."""
        onnx_path = self.onnx_path(mdir, options.dynamic_batch)
        sha = model.checkpoint_sha256 if is_loaded_model(model) else checkpoint_sha256(spec)
        onnx_reason = self.onnx_stale_reason(spec, sha, onnx_path)
        if onnx_reason is not None:
            if onnx_reason == "missing" and not (mdir / f"{stem}.json").exists():
                return "missing"
            return f"ONNX {onnx_reason}"
        parts = self.key_parts(spec, builder, options, env, onnx_path)
        why = self.stale_reason(mdir, stem, builder, parts)
        if why is not None:
            return why
        return self.reused(mdir, stem, builder, options, onnx_path, quiet)

    def reused(self, mdir: Path, stem: str, builder: Builder, options: BuildOptions,
               onnx_path: Path, quiet: bool = False) -> Artifact:
        manifest = read_json(mdir / f"{stem}.json") or {}
        path = mdir / f"{stem}{builder.suffix}" if builder.suffix else None
        built_here = mdir / f"{stem}.json" in self.built_here
        if not quiet:
            log.info("engine_reused", backend=builder.name, precision=options.precision,
                     path=str(path or mdir / f"{stem}.json"),
                     key=str(manifest.get("key"))[:12], built_here=built_here)
        return Artifact(builder.name, options.precision, path, onnx_path, manifest, True,
                        BUILT_HERE if built_here else None, mdir / f"{stem}.json")
