"""The engine store: build once per (model, backend, precision, device), reuse on every start.

Every file is written to a temp file, fsynced and renamed, and a manifest is trusted only when
the artefact's size and sha256 match it: a killed build never leaves a broken engine used.
The layout is the comment above EngineStore.
"""

from __future__ import annotations

import builtins
import dataclasses
import errno
import functools
import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stgcnd.engines.builders import BuildContext, Builder, build_steps, get_builder
from stgcnd.engines.child_build import BuildProcessDied, run_in_child
from stgcnd.engines.device import device_identity, runtime_identity
from stgcnd.engines.exported import (
    ExportedModel,
    checkpoint_sha256,
    is_onnx_checkpoint,
    read_sidecar,
    sidecar_path,
)
from stgcnd.engines.keys import describe_key_change, key_digest, make_key_parts
from stgcnd.engines.lock import READ_ONLY_ERRNOS, build_lock
from stgcnd.engines.options import BACKENDS, BuildOptions
from stgcnd.engines.retry import BuildRetry, iso
from stgcnd.errors import (
    BackendUnavailable,
    BuildCancelled,
    BuildFailed,
    PreviousBuildFailed,
    StoreReadOnly,
    UserError,
    ValidationError,
)
from stgcnd.runtimes.free_memory import device_memory
from stgcnd.fsutil import atomic_write_bytes, atomic_write_json, file_sha256
from stgcnd.log import get_logger
from stgcnd.model.reference import load_for_inference, torch_installed, torch_missing
from stgcnd.versions import tool_versions

log = get_logger(__name__)

MB = 1 << 20
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


def _is_loaded_model(obj: Any) -> bool:
    return hasattr(obj, "module") and hasattr(obj, "spec")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:40] or "model"


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
    return f"{_slug(stem)}-{key_digest(ident)[:10]}"


def export_key(spec: Any, checkpoint_sha256: str | None, dynamic_batch: bool) -> dict[str, Any]:
    """What the exported ONNX depends on; any change re-exports it."""
    return {"checkpoint_sha256": checkpoint_sha256,
            "demo_seed": spec.seed if spec.checkpoint is None else None,
            "layout": spec.layout, "persons": spec.persons, "frames": spec.frames,
            "motion": spec.motion, "graph_op": spec.graph_op, "dynamic_batch": dynamic_batch,
            "variant": DEMO_EXPORT_VARIANT if spec.checkpoint is None else EXPORT_VARIANT}


_sidecar = sidecar_path


def _read_json(path: Path) -> dict[str, Any] | None:

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_failure(what: Path, exc: OSError) -> UserError:
    why = exc.strerror or str(exc)
    if exc.errno == errno.EROFS:
        return StoreReadOnly(f"cannot write {what}: the engine store is on a read-only "
                             "filesystem; build the engines beforehand where it is writable "
                             "(`stgcnd build --config ...`) or pass --engines DIR (engines_dir)"
                             " on a writable disk. The previous artefact, if any, is kept")
    return UserError(f"cannot write {what}: {why}; free space on that disk or make it writable "
                     "(or pass --engines DIR elsewhere). The previous artefact, if any, is kept")


def _on_gpu(builder: Builder, options: BuildOptions) -> bool:
    return builder.device_kind(options) == "cuda" or options.device.startswith("cuda")


def _free_bytes(builder: Builder, options: BuildOptions) -> int | None:
    """Free memory for a GPU build (stgcnd.runtimes.free_memory, as the memory plan reads it); None
    for a CPU build or where the driver does not answer."""
    if not _on_gpu(builder, options):
        return None
    try:
        return device_memory()[0]
    except Exception:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return pid > 0


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


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
# The model id names the model's input and source (checkpoint path or demo, layout, persons,
# frames), so several configured models live side by side; the checkpoint's *content* and the
# export settings are in the ONNX's key, so an edited checkpoint re-exports in place.
class EngineStore:
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

    # --- paths ---------------------------------------------------------------------------

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

    # --- public API ----------------------------------------------------------------------

    def prepare(self, model: Any, backend: str, options: BuildOptions | None = None, *,
                rebuild: str | None = None, validate: bool = True) -> Artifact:
        """Export/re-export the ONNX and build or reuse the artefact; returns it.

        `model` is a LoadedModel, or a ModelSpec (loaded only if something must be built).
        `rebuild` forces a rebuild and is logged as its reason, e.g. when the backend failed
        to load the stored artefact ("failed to load: incompatible device").
        """
        options = options or BuildOptions()
        if backend not in BACKENDS:
            raise UserError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        builder = get_builder(backend)
        options = self._resolve_options(builder, options)
        builder.check(options)
        spec = model.spec if _is_loaded_model(model) else model
        if self.cancel is not None:
            return self._prepare_in_child(spec, backend, options, rebuild, validate)
        mdir = self.model_dir(spec)
        device = builder.device_kind(options)
        stem = self.artifact_stem(backend, options, device)
        try:
            mdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if exc.errno in READ_ONLY_ERRNOS:
                raise self._read_only(f"{mdir.name}/{stem}", "missing", exc) from None
            raise _write_failure(mdir, exc) from None
        with build_lock(mdir / ".locks" / f"{stem}.lock", stem) as writable:
            env = builder.environment(options)
            if rebuild is None:
                found = self._current(spec, model, builder, options, env, mdir, stem)
                if isinstance(found, Artifact):
                    return found
                reason = found
            else:
                reason = rebuild
            if not writable:
                raise self._read_only(f"{mdir.name}/{stem}", reason or "missing")
            loaded = model if _is_loaded_model(model) else self.load(
                spec, options.dynamic_batch)
            onnx_path = self._ensure_onnx(loaded, mdir, options.dynamic_batch)
            parts = self._key_parts(loaded.spec, builder, options, env, onnx_path)
            failed = mdir / f"{stem}.failed.json"
            if rebuild is None:
                why = self._stale_reason(mdir, stem, builder, parts)
                if why is None:  # the re-export gave the same graph: nothing to rebuild
                    return self._reused(mdir, stem, builder, options, onnx_path)
                reason = f"{reason}; {why}" if reason.startswith("ONNX") else why
                self._refuse_failed_before(failed, parts, builder, options)
            return self._build(loaded, builder, options, env, parts, mdir, stem, onnx_path,
                               reason or "missing", validate)

    def _refuse_failed_before(self, failed: Path, parts: dict[str, Any], builder: Builder,
                              options: BuildOptions) -> None:
        """A build that failed with this exact key is not retried at every start (a TensorRT
        build runs for minutes; systemd restarts would run it again and again), only once
        more memory is free or enough time has passed (engines/retry.py). A record left
        `in_progress` is a build process that died (killed: often the out-of-memory
        killer); it counts as a failure."""
        record = _read_json(failed)
        if record is None or record.get("key") != key_digest(parts):
            return
        backend = builder.name
        why = self.retry.why_now(record, _free_bytes(builder, options), time.time())
        if why is not None:
            log.info("engine_build_retry", backend=backend, precision=options.precision,
                     why=why, attempt=int(record.get("attempts", 1)) + 1,
                     max_attempts=self.retry.attempts, error=record.get("error"))
            return
        log.warning("engine_build_retry_later", backend=backend, precision=options.precision,
                    path=str(failed), error=record.get("error"), **self.retry.when(record))
        # The when first: the daemon's backend_fallback line keeps the first 300 characters.
        raise PreviousBuildFailed(
            f"the {backend} {options.precision} build of this model failed on "
            f"{record.get('failed_at')}. Not building it again now: "
            f"{self.retry.describe(record)}; to retry at once run `stgcnd build --backend "
            f"{backend} --precision {options.precision} --rebuild`. It failed with the same "
            f"model, options, versions and device: {record.get('error')}")

    def _record_failure(self, failed: Path, started: dict[str, Any],
                        exc: BaseException | str) -> None:
        """`started`: the record written when the build started (attempts, free memory)."""
        error = exc if isinstance(exc, str) else (_first_line(str(exc))
                                                  or type(exc).__name__)
        now = time.time()
        record = {**{k: v for k, v in started.items() if k not in ("previous", "pid")},
                  "error": error, "in_progress": False,
                  "error_type": "killed" if isinstance(exc, str) else type(exc).__name__,
                  "failed_at": iso(now), "failed_at_s": now}
        try:
            atomic_write_json(failed, record)
        except OSError:
            pass  # a full or read-only disk: the build is simply tried again next time
        log.warning("engine_build_failed", path=str(failed), error=error,
                    free_mb=(record["free_bytes"] // MB
                             if isinstance(record.get("free_bytes"), int) else None),
                    **self.retry.when(record))

    def _started(self, failed: Path, parts: dict[str, Any], builder: Builder,
                 options: BuildOptions) -> dict[str, Any]:
        """The record of a build about to start, left in place while a GPU build runs: a
        build process killed on the way (the out-of-memory killer's SIGKILL) leaves it, and
        it counts as a failed attempt. A CPU build takes seconds and is not the one the
        killer picks: one killed is simply run again."""
        previous = _read_json(failed)
        key = key_digest(parts)
        attempts = int(previous.get("attempts", 1)) if previous and \
            previous.get("key") == key else 0
        now = time.time()
        record = {"key": key, "key_parts": parts, "attempts": attempts + 1,
                  "free_bytes": _free_bytes(builder, options), "in_progress": True,
                  "pid": os.getpid(), "error": "the build process ended before the build did "
                  "(killed: often the out-of-memory killer)", "error_type": "killed",
                  "failed_at": iso(now), "failed_at_s": now,
                  "previous": {k: v for k, v in (previous or {}).items() if k != "previous"}}
        if not _on_gpu(builder, options):
            return record
        try:
            atomic_write_json(failed, record)
        except OSError:
            pass
        return record

    def _build_died(self, spec: Any, backend: str, options: BuildOptions,
                    died: BuildProcessDied | None) -> None:
        """The build child died without an answer: its started record becomes a failure;
        or (`died` None) it was cancelled and killed: its started record is forgotten."""
        builder = get_builder(backend)
        mdir = self.model_dir(spec)
        failed = mdir / f"{self.artifact_stem(backend, options, builder.device_kind(options))}" \
            ".failed.json"
        record = _read_json(failed)
        if record is None or not record.get("in_progress"):
            return  # it died before starting the build itself (exporting, loading)
        if died is None:
            if not _alive(int(record.get("pid", 0))):
                self._forget_started(failed, record)
            return
        if record.get("pid") != died.pid:
            return
        self._record_failure(failed, record, f"the build process was {died.how} (often the "
                             "out-of-memory killer: free memory, lower max_batch, add swap)")

    @staticmethod
    def _forget_started(failed: Path, started: dict[str, Any]) -> None:
        """A cancelled build is no failure: the record as it was before it started."""
        previous = started.get("previous")
        try:
            if previous:
                atomic_write_json(failed, previous)
            else:
                failed.unlink(missing_ok=True)
        except OSError:
            pass

    def _prepare_in_child(self, spec: Any, backend: str, options: BuildOptions,
                          rebuild: str | None, validate: bool) -> Artifact:
        """`prepare` for a store with a cancel event: nothing is spawned when the artefact is
        current; otherwise the child builds it and this process reads it back."""
        assert self.cancel is not None
        if self.cancel.is_set():
            raise BuildCancelled("cancelled before the engine store was asked")
        if rebuild is None:
            found = self.find(spec, backend, options)
            if found is not None:
                return found
        try:
            reused, reason = run_in_child(functools.partial(type(self), retry=self.retry),
                                          self.root, spec, backend, options, rebuild,
                                          validate, self.cancel)
        except BuildProcessDied as died:
            self._build_died(spec, backend, options, died)
            raise
        except BuildCancelled:
            self._build_died(spec, backend, options, None)
            raise
        # The child committed (or found) it; read it back here without logging a second line.
        found = EngineStore(self.root).find(spec, backend, options, quiet=True)
        if found is None:
            raise RuntimeError(f"the {backend} artefact built by the build process is not "
                               f"current in {self.root}; another process may have changed it "
                               "meanwhile")
        if not reused and found.manifest_path is not None:
            self.built_here.add(found.manifest_path)
        return dataclasses.replace(found, reused=reused, reason=reason)

    def export(self, model: Any, dynamic_batch: bool) -> Path:
        """Export (or keep) the model's ONNX in the store, building nothing from it: what a
        board whose engine is built there needs from a workstation (`build --platform`)."""
        spec = model.spec if _is_loaded_model(model) else model
        mdir = self.model_dir(spec)
        try:
            mdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _write_failure(mdir, exc) from None
        loaded = model if _is_loaded_model(model) else self.load(spec, dynamic_batch)
        return self._ensure_onnx(loaded, mdir, dynamic_batch)

    def find(self, spec: Any, backend: str, options: BuildOptions | None = None,
             quiet: bool = False) -> Artifact | None:
        """The stored artefact if it is current, without loading the model (no torch).

        `quiet`: no engine_reused line (the caller logs what happened itself)."""
        options = options or BuildOptions()
        builder = get_builder(backend)
        options = self._resolve_options(builder, options)
        mdir = self.model_dir(spec)
        stem = self.artifact_stem(backend, options, builder.device_kind(options))
        if not (mdir / f"{stem}.json").exists():
            return None
        with build_lock(mdir / ".locks" / f"{stem}.lock", stem):
            found = self._current(spec, spec, builder, options, builder.environment(options),
                                  mdir, stem, quiet=quiet)
        return found if isinstance(found, Artifact) else None

    def _read_only(self, what: str, reason: str, exc: OSError | None = None) -> StoreReadOnly:
        why = f" ({exc.strerror})" if exc is not None and exc.strerror else ""
        return StoreReadOnly(
            f"the engine store {self.root} is read-only{why} and {what} must be built "
            f"({reason}); build it beforehand where the store is writable "
            f"(`stgcnd build --config CONFIG --engines {self.root}`), or point engines_dir "
            "(--engines) at a writable directory")

    def list(self) -> list[dict[str, Any]]:
        """Every manifest in the store, with whether it still matches this machine."""
        rows = []
        for manifest_path in sorted(self.root.glob("*/*.json")):
            if manifest_path.name == "model.json":
                continue
            m = _read_json(manifest_path)
            if not m or m.get("format") != MANIFEST_FORMAT:
                continue
            art = m.get("artifact")
            path = manifest_path.parent / art if art else None
            rows.append({
                "model": manifest_path.parent.name, "backend": m.get("backend"),
                "precision": m.get("precision"), "device": m.get("device"),
                "max_batch": m.get("max_batch"),
                "backend_version": m.get("key_parts", {}).get("backend_version"),
                "path": str(path or manifest_path), "size_bytes": m.get("size_bytes"),
                "built_at": m.get("built_at"), "build_seconds": m.get("build_seconds"),
                "validation": m.get("validation"),
                "status": self._status(manifest_path, m),
            })
        return rows

    # builtins.list: in the class body, `list` is the method above.
    def prune(self, dry_run: bool = False) -> builtins.list[dict[str, Any]]:
        """Remove what can never be used again here; returns [{path, reason}].

        Leftovers of killed builds; artefacts whose file is missing or does not match its
        manifest; artefacts built for another backend version or device than this machine's
        (kept when that backend is not installed here, as the store may be on its way to
        another device).
        """
        removed: list[dict[str, Any]] = []

        def drop(path: Path, reason: str) -> None:
            removed.append({"path": str(path), "reason": reason})
            log.info("engine_pruned", path=str(path), reason=reason, dry_run=dry_run)
            if not dry_run:
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

        for mdir in sorted(p for p in self.root.glob("*") if p.is_dir()):
            for tmp in sorted(mdir.rglob(".*")):
                if tmp.is_file() and self._is_dead_temp(mdir, tmp):
                    drop(tmp, "left over from an interrupted write")
            for manifest_path in sorted(mdir.glob("*.json")):
                m = _read_json(manifest_path)
                if manifest_path.name == "model.json" or not m:
                    continue
                if m.get("format") != MANIFEST_FORMAT:
                    continue
                status = self._status(manifest_path, m)
                if status.startswith("stale") or status.startswith("corrupt"):
                    if m.get("artifact"):
                        drop(manifest_path.parent / m["artifact"], status)
                    drop(manifest_path, status)
        return removed

    # --- internals -----------------------------------------------------------------------

    def _resolve_options(self, builder: Builder, options: BuildOptions) -> BuildOptions:
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

    def load(self, spec: Any, dynamic_batch: bool) -> Any:
        """The model to build from: loaded by torch; without torch (or for an .onnx given as
        the checkpoint) its exported ONNX stands in (engines/exported.py); the demo model
        without torch is its numpy stand-in."""
        if spec.is_demo or (torch_installed() and not is_onnx_checkpoint(spec)):
            return load_for_inference(spec)
        mdir = self.model_dir(spec)
        path = self.onnx_path(mdir, dynamic_batch)
        sha = checkpoint_sha256(spec)
        if is_onnx_checkpoint(spec) and self._onnx_stale_reason(spec, sha, path) is not None:
            self._import_onnx(spec, Path(spec.checkpoint).expanduser(), mdir, dynamic_batch)
        if self._onnx_stale_reason(spec, sha, path) is None:
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

    def _import_onnx(self, spec: Any, source: Path, mdir: Path, dynamic_batch: bool) -> None:
        """Take an ONNX exported elsewhere (`checkpoint = "model.onnx"`) into the store."""
        sidecar = read_sidecar(source)
        if sidecar is None or not source.is_file():
            raise UserError(f"{source} or its sidecar {sidecar_path(source).name} is missing; "
                            "copy both from where `stgcnd export` wrote them")
        if bool(sidecar.get("dynamic_batch")) != dynamic_batch:
            raise UserError(
                f"{source} was exported with " + ("a dynamic batch" if sidecar.get(
                    "dynamic_batch") else "a batch of 1") + ", the configuration needs " +
                ("a dynamic batch (max_batch > 1): export again without --static-batch"
                 if dynamic_batch else "a batch of 1 (max_batch = 1): export again with "
                 "--static-batch, or set max_batch = 0 (automatic) to batch cameras"))
        ExportedModel.from_onnx(spec, source)  # the shape and motion formula match
        data = source.read_bytes()
        if hashlib.sha256(data).hexdigest() != sidecar.get("onnx_sha256"):
            raise UserError(f"{source} does not match its sidecar's sha256 (copied "
                            "incompletely?); copy it again")
        path = self.onnx_path(mdir, dynamic_batch)
        with build_lock(mdir / ".locks" / f"{path.stem}.lock", path.name) as writable:
            if not writable:
                raise self._read_only(f"{mdir.name}/{path.relative_to(mdir)}", "missing")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(path, data)
                atomic_write_json(_sidecar(path), {
                    **sidecar, "imported_from": str(source),
                    "store_export_key": export_key(spec, sidecar["checkpoint_sha256"],
                                                   dynamic_batch),
                    "store_size_bytes": len(data)})
            except OSError as exc:
                raise _write_failure(path, exc) from None
        log.info("onnx_imported", source=str(source), path=str(path),
                 checkpoint_sha256=sidecar["checkpoint_sha256"])

    def _checkpoint_sha(self, model: Any, spec: Any) -> str | None:
        if _is_loaded_model(model):
            return model.checkpoint_sha256
        return checkpoint_sha256(spec)

    def _onnx_stale_reason(self, spec: Any, checkpoint_sha: str | None, path: Path
                           ) -> str | None:
        sidecar = _read_json(_sidecar(path))
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

    def _ensure_onnx(self, model: Any, mdir: Path, dynamic_batch: bool) -> Path:
        path = self.onnx_path(mdir, dynamic_batch)
        with build_lock(mdir / ".locks" / f"{path.stem}.lock", path.name) as writable:
            reason = self._onnx_stale_reason(model.spec, model.checkpoint_sha256, path)
            if reason is None:
                return path
            if not writable:
                raise self._read_only(f"{mdir.name}/{path.relative_to(mdir)}", reason)
            log.info("onnx_export_needed", path=str(path), reason=reason)
            try:
                res = build_steps().export_onnx(
                    model, path, dynamic_batch,
                    DEMO_EXPORT_VARIANT if model.spec.is_demo else EXPORT_VARIANT)
                sidecar = {**res.sidecar,
                           "store_export_key": export_key(model.spec, model.checkpoint_sha256,
                                                         dynamic_batch),
                           "store_size_bytes": path.stat().st_size}
                atomic_write_json(_sidecar(path), sidecar)
                atomic_write_json(mdir / "model.json", {
                    "format": MODEL_FORMAT, "model_id": mdir.name, "spec": model.spec.to_dict(),
                    "checkpoint_sha256": model.checkpoint_sha256,
                    "num_class": model.num_class, "labels": list(model.labels)})
            except OSError as exc:
                raise _write_failure(path, exc) from None
        return path

    def _onnx_sha(self, path: Path) -> str:
        sidecar = _read_json(_sidecar(path)) or {}
        return str(sidecar.get("onnx_sha256"))

    def _key_parts(self, spec: Any, builder: Builder, options: BuildOptions,
                   env: dict[str, Any], onnx_path: Path) -> dict[str, Any]:
        return make_key_parts(
            onnx_sha256=self._onnx_sha(onnx_path), backend=builder.name,
            backend_version=env["backend_version"], device=env["device"],
            options=options.key_dict(builder.name), input_shape=list(spec.input_shape),
            batch_range=[1, options.max_batch], runtime=env.get("runtime"))

    def _stale_reason(self, mdir: Path, stem: str, builder: Builder,
                      parts: dict[str, Any]) -> str | None:
        manifest = _read_json(mdir / f"{stem}.json")
        art = mdir / f"{stem}{builder.suffix}" if builder.suffix else None
        if manifest is None and (mdir / f"{stem}.json").exists():
            return "corrupt: manifest unreadable"
        if manifest is None or (art is not None and not art.exists()):
            return "missing"
        if manifest.get("key") != key_digest(parts):
            return "key changed: " + "; ".join(
                describe_key_change(manifest.get("key_parts") or {}, parts))
        if art is not None:
            return self._integrity_problem(art, manifest)
        return None

    @staticmethod
    def _integrity_problem(art: Path, manifest: dict[str, Any]) -> str | None:
        size = art.stat().st_size
        if size != manifest.get("size_bytes"):
            return (f"failed to load: corrupt (size {size} bytes, manifest says "
                    f"{manifest.get('size_bytes')}; truncated?)")
        if file_sha256(art) != manifest.get("sha256"):
            return "failed to load: corrupt (sha256 differs from the manifest)"
        return None

    def _current(self, spec: Any, model: Any, builder: Builder, options: BuildOptions,
                 env: dict[str, Any], mdir: Path, stem: str, quiet: bool = False
                 ) -> Artifact | str:
        """The artefact if ONNX and artefact are current (no torch needed), else why not."""
        dynamic = options.dynamic_batch
        onnx_path = self.onnx_path(mdir, dynamic)
        onnx_reason = self._onnx_stale_reason(spec, self._checkpoint_sha(model, spec), onnx_path)
        if onnx_reason is not None:
            if onnx_reason == "missing" and not (mdir / f"{stem}.json").exists():
                return "missing"
            return f"ONNX {onnx_reason}"
        parts = self._key_parts(spec, builder, options, env, onnx_path)
        why = self._stale_reason(mdir, stem, builder, parts)
        if why is not None:
            return why
        return self._reused(mdir, stem, builder, options, onnx_path, quiet)

    def _reused(self, mdir: Path, stem: str, builder: Builder, options: BuildOptions,
                onnx_path: Path, quiet: bool = False) -> Artifact:
        manifest = _read_json(mdir / f"{stem}.json") or {}
        path = mdir / f"{stem}{builder.suffix}" if builder.suffix else None
        built_here = mdir / f"{stem}.json" in self.built_here
        if not quiet:
            log.info("engine_reused", backend=builder.name, precision=options.precision,
                     path=str(path or mdir / f"{stem}.json"),
                     key=str(manifest.get("key"))[:12], built_here=built_here)
        return Artifact(builder.name, options.precision, path, onnx_path, manifest, True,
                        BUILT_HERE if built_here else None, mdir / f"{stem}.json")

    def _ensure_qdq(self, model: Any, options: BuildOptions, onnx_path: Path
                    ) -> tuple[Path, Any, dict[str, Any]]:
        """The Q/DQ INT8 ONNX for this calibration data (made once, shared by backends)."""
        steps = build_steps()
        windows, info = steps.calibration_windows(options, model.spec)
        calib = options.extra.get("calibration_sha256") or "synthetic"
        source_sha = self._onnx_sha(onnx_path)
        tag = hashlib.sha256(f"{source_sha}:{calib}".encode()).hexdigest()[:12]
        path = onnx_path.with_name(f"{onnx_path.stem}.int8-{tag}.onnx")
        sidecar = path.with_name(path.name + ".json")
        with build_lock(path.parent.parent / ".locks" / f"{path.stem}.lock", path.name):
            meta = _read_json(sidecar)
            if (meta and path.exists() and meta.get("source_onnx_sha256") == source_sha
                    and meta.get("calibration") == calib
                    and meta.get("size_bytes") == path.stat().st_size):
                return path, windows, info
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.onnx")
            try:
                q = steps.quantize_qdq(onnx_path, tmp, windows, options.dynamic_batch)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                atomic_write_json(sidecar, {"source_onnx_sha256": source_sha,
                                            "calibration": calib, "calibration_source": info,
                                            "quantization": q,
                                            "size_bytes": path.stat().st_size,
                                            "sha256": file_sha256(path)})
            except OSError as exc:
                raise _write_failure(path, exc) from None
            finally:
                tmp.unlink(missing_ok=True)
        return path, windows, info

    def _build(self, model: Any, builder: Builder, options: BuildOptions, env: dict[str, Any],
               parts: dict[str, Any], mdir: Path, stem: str, onnx_path: Path, reason: str,
               validate: bool) -> Artifact:
        log.info("engine_build_started", backend=builder.name, precision=options.precision,
                 model=mdir.name, reason=reason)
        for old_tmp in mdir.glob(f".{stem}.tmp-*"):
            old_tmp.unlink(missing_ok=True)  # a killed build's leftovers (we hold the lock)
        calib_info: dict[str, Any]
        qdq_path, windows, calib_info = (None, None, {})
        if builder.needs_qdq(options):
            qdq_path, windows, calib_info = self._ensure_qdq(model, options, onnx_path)
        elif options.precision == "int8":
            windows, calib_info = build_steps().calibration_windows(options, model.spec)
        ctx = BuildContext(model, options, onnx_path, qdq_path, mdir, self.root, windows,
                           calib_info)
        final = mdir / f"{stem}{builder.suffix}" if builder.suffix else None
        tmp = mdir / f".{stem}.tmp-{os.getpid()}{builder.suffix or '.json'}"
        manifest_path = mdir / f"{stem}.json"
        failed = mdir / f"{stem}.failed.json"
        started = self._started(failed, parts, builder, options)
        recorded = False
        t0 = time.perf_counter()
        try:
            try:
                extra = builder.build(ctx, tmp)
            except OSError as exc:
                raise _write_failure(final or manifest_path, exc) from None
            except (BuildCancelled, KeyboardInterrupt):
                raise
            except Exception as exc:  # the runtime refused to build it (out of memory...)
                self._record_failure(failed, started, exc)
                recorded = True
                raise BuildFailed(
                    f"the {builder.name} {options.precision} build failed: "
                    f"{_first_line(str(exc)) or type(exc).__name__}; a smaller max_batch or "
                    "workspace, another precision, or freeing device memory may let it "
                    "build") from exc
            build_seconds = time.perf_counter() - t0
            if final is not None:
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
            manifest = self._manifest(model, builder, options, env, parts, stem, onnx_path,
                                      qdq_path, calib_info, extra, build_seconds,
                                      tmp if final is not None else None)
            validation: dict[str, Any] | None = None
            if validate:
                draft = Artifact(builder.name, options.precision,
                                 tmp if final is not None else None, onnx_path, manifest,
                                 False, reason, manifest_path)
                try:
                    validation = self._validate(builder, ctx, draft)
                except ValidationError as exc:  # built, but wrong: the same build would be
                    self._record_failure(failed, started, exc)
                    recorded = True
                    raise
            manifest["validation"] = validation
            try:
                if final is not None:
                    os.replace(tmp, final)
                atomic_write_json(manifest_path, manifest)
            except OSError as exc:
                raise _write_failure(manifest_path, exc) from None
        except BaseException:
            if not recorded:  # cancelled, or the disk: not the build's failure
                self._forget_started(failed, started)
            raise
        finally:
            tmp.unlink(missing_ok=True)
        failed.unlink(missing_ok=True)
        log.info("engine_rebuilt", backend=builder.name, precision=options.precision,
                 model=mdir.name, reason=reason, path=str(final or manifest_path),
                 build_seconds=round(build_seconds, 3), size_bytes=manifest["size_bytes"],
                 validation=validation)
        self.built_here.add(manifest_path)
        return Artifact(builder.name, options.precision, final, onnx_path, manifest, False,
                        reason, manifest_path)

    def _manifest(self, model: Any, builder: Builder, options: BuildOptions,
                  env: dict[str, Any], parts: dict[str, Any], stem: str, onnx_path: Path,
                  qdq_path: Path | None, calib_info: dict[str, Any], extra: dict[str, Any],
                  build_seconds: float, artefact: Path | None) -> dict[str, Any]:
        mdir = onnx_path.parent.parent
        return {
            "format": MANIFEST_FORMAT, "backend": builder.name, "precision": options.precision,
            "device": builder.device_kind(options),
            "artifact": f"{stem}{builder.suffix}" if artefact is not None else None,
            "onnx": str(onnx_path.relative_to(mdir)),
            "source_onnx": str((qdq_path or onnx_path).relative_to(mdir)),
            "key": key_digest(parts), "key_parts": parts,
            "input_shape": list(model.spec.input_shape), "num_class": model.num_class,
            "labels": list(model.labels), "max_batch": options.max_batch,
            "dynamic_batch": options.dynamic_batch, "model": model.spec.to_dict(),
            "checkpoint_sha256": model.checkpoint_sha256,
            "size_bytes": artefact.stat().st_size if artefact is not None else 0,
            "sha256": file_sha256(artefact) if artefact is not None else None,
            "build_seconds": round(build_seconds, 3),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "calibration": calib_info or None, "builder": extra,
            "versions": tool_versions(), "validation": None,
        }

    def _validate(self, builder: Builder, ctx: BuildContext, draft: Artifact
                  ) -> dict[str, Any]:
        try:
            backend = builder.open(draft, ctx.options, ctx.model, ctx.store_root)
        except (BackendUnavailable, ImportError) as exc:
            log.warning("engine_validation_skipped", backend=builder.name, reason=str(exc))
            return {"skipped": str(exc)}
        except Exception as exc:
            # What was just built does not load: keeping it would only fail at the next start.
            raise ValidationError(
                f"the {builder.name} {ctx.options.precision} artefact just built does not "
                f"load ({_first_line(str(exc))}); it is not kept. Try another precision or "
                "backend, or report this with `stgcnd doctor` output") from None
        try:
            result = build_steps().validate_backend(ctx.model, backend)
        except BackendUnavailable as exc:  # no reference here (no torch, no onnxruntime)
            log.warning("engine_validation_skipped", backend=builder.name, reason=str(exc))
            return {"skipped": str(exc)}
        finally:
            backend.close()
        if not result["finite"]:
            raise ValidationError(
                f"the {builder.name} {ctx.options.precision} artefact returns NaN/inf on "
                "synthetic windows; it is not kept. Try another precision, or report this "
                "with `stgcnd doctor` output")
        return result

    def _status(self, manifest_path: Path, m: dict[str, Any]) -> str:
        """current | stale: ... | corrupt: ... | unknown: ... (backend not installed here)."""
        art = m.get("artifact")
        if art:
            path = manifest_path.parent / art
            if not path.exists():
                return "corrupt: artefact file missing"
            if path.stat().st_size != m.get("size_bytes"):
                return "corrupt: size differs from the manifest"
        try:
            builder = get_builder(str(m.get("backend")))
            version = builder.version()
        except UserError as exc:
            return f"unknown: {exc}"
        parts = m.get("key_parts") or {}
        if parts.get("backend_version") != version:
            return (f"stale: built with {m.get('backend')} {parts.get('backend_version')}, "
                    f"this machine has {version}")
        if parts.get("device") != device_identity(str(m.get("device"))):
            return "stale: built for another device"
        runtime = runtime_identity(str(m.get("backend")))
        if (parts.get("runtime") or {}) != runtime:
            changes = describe_key_change(parts.get("runtime") or {}, runtime)
            return "stale: runtime libraries changed: " + "; ".join(changes)
        return "current"

    def _is_dead_temp(self, mdir: Path, tmp: Path) -> bool:
        m = re.match(r"\.(.+)\.tmp-(\d+)", tmp.name)
        if m:
            pid = int(m.group(2))
            try:
                os.kill(pid, 0)
                return False  # the writing process is alive
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        # Older fsutil.atomic_write temp files ('.<name>.<random>.part', no pid): give live
        # writers an hour.
        return tmp.name.endswith(".part") and time.time() - tmp.stat().st_mtime > 3600
