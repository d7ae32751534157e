"""Making what the engine store holds (the ONNX exported or imported, the artefact built,
validated and committed, a failure recorded) and its inventory (`list`, `prune`). Every file is
written to a temp file, fsynced and renamed: a killed build never leaves a broken artefact used.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from stgcnd.engines.builders import BuildContext, Builder, build_steps, get_builder
from stgcnd.engines.builders.base import device_identity
from stgcnd.engines.child_build import BuildProcessDied, run_in_child
from stgcnd.engines.device import runtime_identity
from stgcnd.engines.exported import ExportedModel, read_sidecar, sidecar_path
from stgcnd.engines.keys import describe_key_change, key_digest
from stgcnd.engines.lock import READ_ONLY_ERRNOS, build_lock
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.retry import iso
from stgcnd.engines.stored import (
    DEMO_EXPORT_VARIANT,
    EXPORT_VARIANT,
    MANIFEST_FORMAT,
    MODEL_FORMAT,
    Artifact,
    StoreLookup,
    export_key,
    is_loaded_model,
    onnx_sha,
    read_json,
)
from stgcnd.errors import (
    BackendUnavailable,
    BuildCancelled,
    BuildFailed,
    PreviousBuildFailed,
    StoreReadOnly,
    UserError,
    ValidationError,
    first_line,
)
from stgcnd.fsutil import atomic_write_bytes, atomic_write_json, file_sha256
from stgcnd.log import get_logger
from stgcnd.runtimes.free_memory import MB, device_memory
from stgcnd.versions import tool_versions

log = get_logger(__name__)


def prepare(store: StoreLookup, model: Any, spec: Any, builder: Builder,
            options: BuildOptions, rebuild: str | None, validate: bool) -> Artifact:
    """EngineStore.prepare once the artefact was not found current (or `rebuild` says why it
    must be made again): checked again under its lock, then built."""
    if store.cancel is not None:
        return _in_child(store, spec, builder.name, options, rebuild, validate)
    mdir = store.model_dir(spec)
    device = builder.device_kind(options)
    stem = store.artifact_stem(builder.name, options, device)
    try:
        mdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in READ_ONLY_ERRNOS:
            raise _read_only(store, f"{mdir.name}/{stem}", "missing", exc) from None
        raise _write_failure(mdir, exc) from None
    with build_lock(mdir / ".locks" / f"{stem}.lock", stem) as writable:
        env = builder.environment(options)
        if rebuild is None:
            found = store.current(spec, model, builder, options, env, mdir, stem)
            if isinstance(found, Artifact):
                return found
            reason = found
        else:
            reason = rebuild
        if not writable:
            raise _read_only(store, f"{mdir.name}/{stem}", reason or "missing")
        loaded = model if is_loaded_model(model) else store.load(spec, options.dynamic_batch)
        onnx_path = _ensure_onnx(store, loaded, mdir, options.dynamic_batch)
        parts = store.key_parts(loaded.spec, builder, options, env, onnx_path)
        failed = mdir / f"{stem}.failed.json"
        if rebuild is None:
            why = store.stale_reason(mdir, stem, builder, parts)
            if why is None:  # the re-export gave the same graph: nothing to rebuild
                return store.reused(mdir, stem, builder, options, onnx_path)
            reason = f"{reason}; {why}" if reason.startswith("ONNX") else why
            _refuse_failed_before(store, failed, parts, builder, options)
        return _build(store, loaded, builder, options, env, parts, mdir, stem, onnx_path,
                      reason or "missing", validate)


def export(store: StoreLookup, model: Any, dynamic_batch: bool) -> Path:
    spec = model.spec if is_loaded_model(model) else model
    mdir = store.model_dir(spec)
    try:
        mdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _write_failure(mdir, exc) from None
    loaded = model if is_loaded_model(model) else store.load(spec, dynamic_batch)
    return _ensure_onnx(store, loaded, mdir, dynamic_batch)


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
    """Free memory for a GPU build (stgcnd.runtimes.free_memory, as the memory plan reads
    it); None for a CPU build or where the driver does not answer."""
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


def _refuse_failed_before(store: StoreLookup, failed: Path, parts: dict[str, Any],
                          builder: Builder, options: BuildOptions) -> None:
    """A build that failed with this exact key is not retried at every start (a TensorRT
    build runs for minutes; systemd restarts would run it again and again), only once
    more memory is free or enough time has passed (engines/retry.py). A record left
    `in_progress` is a build process that died (killed: often the out-of-memory
    killer); it counts as a failure."""
    record = read_json(failed)
    if record is None or record.get("key") != key_digest(parts):
        return
    backend = builder.name
    why = store.retry.why_now(record, _free_bytes(builder, options), time.time())
    if why is not None:
        log.info("engine_build_retry", backend=backend, precision=options.precision,
                 why=why, attempt=int(record.get("attempts", 1)) + 1,
                 max_attempts=store.retry.attempts, error=record.get("error"))
        return
    log.warning("engine_build_retry_later", backend=backend, precision=options.precision,
                path=str(failed), error=record.get("error"), **store.retry.when(record))
    # The when first: the daemon's backend_fallback line keeps the first 300 characters.
    raise PreviousBuildFailed(
        f"the {backend} {options.precision} build of this model failed on "
        f"{record.get('failed_at')}. Not building it again now: "
        f"{store.retry.describe(record)}; to retry at once run `stgcnd build --backend "
        f"{backend} --precision {options.precision} --rebuild`. It failed with the same "
        f"model, options, versions and device: {record.get('error')}")


def _record_failure(store: StoreLookup, failed: Path, started: dict[str, Any],
                    exc: BaseException | str) -> None:
    """`started`: the record written when the build started (attempts, free memory)."""
    error = exc if isinstance(exc, str) else (first_line(str(exc))
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
                **store.retry.when(record))


def _started(failed: Path, parts: dict[str, Any], builder: Builder,
             options: BuildOptions) -> dict[str, Any]:
    """The record of a build about to start, left in place while a GPU build runs: a
    build process killed on the way (the out-of-memory killer's SIGKILL) leaves it, and
    it counts as a failed attempt. A CPU build takes seconds and is not the one the
    killer picks: one killed is simply run again."""
    previous = read_json(failed)
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


def _build_died(store: StoreLookup, spec: Any, backend: str, options: BuildOptions,
                died: BuildProcessDied | None) -> None:
    """The build child died without an answer: its started record becomes a failure;
    or (`died` None) it was cancelled and killed: its started record is forgotten."""
    builder = get_builder(backend)
    mdir = store.model_dir(spec)
    failed = mdir / f"{store.artifact_stem(backend, options, builder.device_kind(options))}" \
        ".failed.json"
    record = read_json(failed)
    if record is None or not record.get("in_progress"):
        return  # it died before starting the build itself (exporting, loading)
    if died is None:
        if not _alive(int(record.get("pid", 0))):
            _forget_started(failed, record)
        return
    if record.get("pid") != died.pid:
        return
    _record_failure(store, failed, record, f"the build process was {died.how} (often the "
                    "out-of-memory killer: free memory, lower max_batch, add swap)")


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


def _in_child(store: StoreLookup, spec: Any, backend: str, options: BuildOptions,
              rebuild: str | None, validate: bool) -> Artifact:
    """`prepare` for a store with a cancel event: the child builds the artefact and this
    process reads it back."""
    assert store.cancel is not None
    try:
        reused, reason = run_in_child(functools.partial(type(store), retry=store.retry),
                                      store.root, spec, backend, options, rebuild,
                                      validate, store.cancel)
    except BuildProcessDied as died:
        _build_died(store, spec, backend, options, died)
        raise
    except BuildCancelled:
        _build_died(store, spec, backend, options, None)
        raise
    # The child committed (or found) it; read it back here without logging a second line.
    found = StoreLookup(store.root).find(spec, backend, options, quiet=True)
    if found is None:
        raise RuntimeError(f"the {backend} artefact built by the build process is not "
                           f"current in {store.root}; another process may have changed it "
                           "meanwhile")
    if not reused and found.manifest_path is not None:
        store.built_here.add(found.manifest_path)
    return dataclasses.replace(found, reused=reused, reason=reason)


def _read_only(store: StoreLookup, what: str, reason: str, exc: OSError | None = None
               ) -> StoreReadOnly:
    why = f" ({exc.strerror})" if exc is not None and exc.strerror else ""
    return StoreReadOnly(
        f"the engine store {store.root} is read-only{why} and {what} must be built "
        f"({reason}); build it beforehand where the store is writable "
        f"(`stgcnd build --config CONFIG --engines {store.root}`), or point engines_dir "
        "(--engines) at a writable directory")


def inventory(store: StoreLookup) -> list[dict[str, Any]]:
    rows = []
    for manifest_path in sorted(store.root.glob("*/*.json")):
        if manifest_path.name == "model.json":
            continue
        m = read_json(manifest_path)
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
            "status": _status(manifest_path, m),
        })
    return rows


def prune(store: StoreLookup, dry_run: bool = False) -> list[dict[str, Any]]:
    removed: list[dict[str, Any]] = []

    def drop(path: Path, reason: str) -> None:
        removed.append({"path": str(path), "reason": reason})
        log.info("engine_pruned", path=str(path), reason=reason, dry_run=dry_run)
        if not dry_run:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    for mdir in sorted(p for p in store.root.glob("*") if p.is_dir()):
        for tmp in sorted(mdir.rglob(".*")):
            if tmp.is_file() and _is_dead_temp(tmp):
                drop(tmp, "left over from an interrupted write")
        for manifest_path in sorted(mdir.glob("*.json")):
            m = read_json(manifest_path)
            if manifest_path.name == "model.json" or not m:
                continue
            if m.get("format") != MANIFEST_FORMAT:
                continue
            status = _status(manifest_path, m)
            if status.startswith("stale") or status.startswith("corrupt"):
                if m.get("artifact"):
                    drop(manifest_path.parent / m["artifact"], status)
                drop(manifest_path, status)
    return removed


def import_onnx(store: StoreLookup, spec: Any, source: Path, mdir: Path,
                dynamic_batch: bool) -> None:
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
    path = store.onnx_path(mdir, dynamic_batch)
    with build_lock(mdir / ".locks" / f"{path.stem}.lock", path.name) as writable:
        if not writable:
            raise _read_only(store, f"{mdir.name}/{path.relative_to(mdir)}", "missing")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, data)
            atomic_write_json(sidecar_path(path), {
                **sidecar, "imported_from": str(source),
                "store_export_key": export_key(spec, sidecar["checkpoint_sha256"],
                                               dynamic_batch),
                "store_size_bytes": len(data)})
        except OSError as exc:
            raise _write_failure(path, exc) from None
    log.info("onnx_imported", source=str(source), path=str(path),
             checkpoint_sha256=sidecar["checkpoint_sha256"])


def _ensure_onnx(store: StoreLookup, model: Any, mdir: Path, dynamic_batch: bool) -> Path:
    path = store.onnx_path(mdir, dynamic_batch)
    with build_lock(mdir / ".locks" / f"{path.stem}.lock", path.name) as writable:
        reason = store.onnx_stale_reason(model.spec, model.checkpoint_sha256, path)
        if reason is None:
            return path
        if not writable:
            raise _read_only(store, f"{mdir.name}/{path.relative_to(mdir)}", reason)
        log.info("onnx_export_needed", path=str(path), reason=reason)
        try:
            res = build_steps().export_onnx(
                model, path, dynamic_batch,
                DEMO_EXPORT_VARIANT if model.spec.is_demo else EXPORT_VARIANT)
            sidecar = {**res.sidecar,
                       "store_export_key": export_key(model.spec, model.checkpoint_sha256,
                                                     dynamic_batch),
                       "store_size_bytes": path.stat().st_size}
            atomic_write_json(sidecar_path(path), sidecar)
            atomic_write_json(mdir / "model.json", {
                "format": MODEL_FORMAT, "model_id": mdir.name, "spec": model.spec.to_dict(),
                "checkpoint_sha256": model.checkpoint_sha256,
                "num_class": model.num_class, "labels": list(model.labels)})
        except OSError as exc:
            raise _write_failure(path, exc) from None
    return path


def _ensure_qdq(model: Any, options: BuildOptions, onnx_path: Path
                ) -> tuple[Path, Any, dict[str, Any]]:
    """The Q/DQ INT8 ONNX for this calibration data (made once, shared by backends)."""
    steps = build_steps()
    windows, info = steps.calibration_windows(options, model.spec)
    calib = options.extra.get("calibration_sha256") or "synthetic"
    source_sha = onnx_sha(onnx_path)
    tag = hashlib.sha256(f"{source_sha}:{calib}".encode()).hexdigest()[:12]
    path = onnx_path.with_name(f"{onnx_path.stem}.int8-{tag}.onnx")
    sidecar = path.with_name(path.name + ".json")
    with build_lock(path.parent.parent / ".locks" / f"{path.stem}.lock", path.name):
        meta = read_json(sidecar)
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


def _build(store: StoreLookup, model: Any, builder: Builder, options: BuildOptions,
           env: dict[str, Any], parts: dict[str, Any], mdir: Path, stem: str, onnx_path: Path,
           reason: str, validate: bool) -> Artifact:
    log.info("engine_build_started", backend=builder.name, precision=options.precision,
             model=mdir.name, reason=reason)
    for old_tmp in mdir.glob(f".{stem}.tmp-*"):
        old_tmp.unlink(missing_ok=True)  # a killed build's leftovers (we hold the lock)
    calib_info: dict[str, Any]
    qdq_path, windows, calib_info = (None, None, {})
    if builder.needs_qdq(options):
        qdq_path, windows, calib_info = _ensure_qdq(model, options, onnx_path)
    elif options.precision == "int8":
        windows, calib_info = build_steps().calibration_windows(options, model.spec)
    ctx = BuildContext(model, options, onnx_path, qdq_path, mdir, store.root, windows,
                       calib_info)
    final = mdir / f"{stem}{builder.suffix}" if builder.suffix else None
    tmp = mdir / f".{stem}.tmp-{os.getpid()}{builder.suffix or '.json'}"
    manifest_path = mdir / f"{stem}.json"
    failed = mdir / f"{stem}.failed.json"
    started = _started(failed, parts, builder, options)
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
            _record_failure(store, failed, started, exc)
            recorded = True
            raise BuildFailed(
                f"the {builder.name} {options.precision} build failed: "
                f"{first_line(str(exc)) or type(exc).__name__}; a smaller max_batch or "
                "workspace, another precision, or freeing device memory may let it "
                "build") from exc
        build_seconds = time.perf_counter() - t0
        if final is not None:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        manifest = make_manifest(model, builder, options, env, parts, stem, onnx_path,
                                 qdq_path, calib_info, extra, build_seconds,
                                 tmp if final is not None else None)
        validation: dict[str, Any] | None = None
        if validate:
            draft = Artifact(builder.name, options.precision,
                             tmp if final is not None else None, onnx_path, manifest,
                             False, reason, manifest_path)
            try:
                validation = validate_artifact(builder, ctx, draft)
            except ValidationError as exc:  # built, but wrong: the same build would be
                _record_failure(store, failed, started, exc)
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
            _forget_started(failed, started)
        raise
    finally:
        tmp.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    log.info("engine_rebuilt", backend=builder.name, precision=options.precision,
             model=mdir.name, reason=reason, path=str(final or manifest_path),
             build_seconds=round(build_seconds, 3), size_bytes=manifest["size_bytes"],
             validation=validation)
    store.built_here.add(manifest_path)
    return Artifact(builder.name, options.precision, final, onnx_path, manifest, False,
                    reason, manifest_path)


def make_manifest(model: Any, builder: Builder, options: BuildOptions,
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


def validate_artifact(builder: Builder, ctx: BuildContext, draft: Artifact
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
            f"load ({first_line(str(exc))}); it is not kept. Try another precision or "
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


def _status(manifest_path: Path, m: dict[str, Any]) -> str:
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


def _is_dead_temp(tmp: Path) -> bool:
    m = re.match(r"\.(.+)\.tmp-(\d+)", tmp.name)
    if m:
        return not _alive(int(m.group(2)))
    # Older fsutil.atomic_write temp files ('.<name>.<random>.part', no pid): give live
    # writers an hour.
    return tmp.name.endswith(".part") and time.time() - tmp.stat().st_mtime > 3600
