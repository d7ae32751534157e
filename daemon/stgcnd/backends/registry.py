"""Pick, prepare and load a backend: `open_backend(model_or_spec, "auto", options, store)`.

"auto" resolves to: tensorrt when TensorRT and pycuda import and a GPU is present; else torch
on CUDA; else whichever CPU backend (torch or onnxruntime) runs this model faster on this
machine, measured with a few batch-1 runs of each and remembered in the store directory
(`auto-backend.json`, keyed by model and machine). "noop" (zero logits, for measuring the
daemon itself) runs only when named; "auto" never picks it.

This module imports neither torch nor tensorrt at import time, and the tensorrt path never
imports torch when the engine is already built (`spec` in, no LoadedModel needed).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from stgcnd.backends.base import Backend
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.fsutil import atomic_write_json
from stgcnd.log import get_logger
from stgcnd.versions import TORCH_FIX, torch_unusable

log = get_logger(__name__)

BACKENDS = ("tensorrt", "torch", "onnxruntime", "noop")
AUTO_CACHE_NAME = "auto-backend.json"
AUTO_PROBE_RUNS = 3


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def gpu_present() -> bool:
    """A CUDA GPU answers the driver (no torch needed; Jetson's iGPU included)."""
    try:
        from stgcnd.engines.device import gpu_identity
    except ImportError:
        return Path("/dev/nvidia0").exists() or Path("/dev/nvhost-ctrl-gpu").exists()
    return gpu_identity() is not None


def available_backends() -> dict[str, str | None]:
    """Backend name -> None when it can run here, else the reason it cannot (and the fix)."""
    out: dict[str, str | None] = {}
    if not _importable("tensorrt"):
        out["tensorrt"] = ("tensorrt is not importable (on a Jetson: a venv with "
                           "--system-site-packages sees JetPack's tensorrt)")
    elif not _importable("pycuda"):
        out["tensorrt"] = "pycuda is not installed (pip install pycuda)"
    elif not gpu_present():
        out["tensorrt"] = "no CUDA GPU found"
    else:
        out["tensorrt"] = None
    out["torch"] = torch_unusable() if _importable("torch") else \
        f"torch is not installed (it is optional): {TORCH_FIX}"
    out["onnxruntime"] = (None if _importable("onnxruntime")
                          else "onnxruntime is not installed (pip install onnxruntime)")
    out["noop"] = None  # numpy only; never picked by "auto" (it computes nothing)
    return out


def torch_cuda_available() -> bool:
    if not _importable("torch"):
        return False
    import torch

    return bool(torch.cuda.is_available())


def default_device(backend: str) -> str:
    """Where an explicitly named backend runs when the user did not say: the GPU if it can."""
    if backend == "tensorrt":
        return "cuda"
    if backend == "torch":
        return "cuda" if torch_cuda_available() else "cpu"
    if backend == "onnxruntime" and _importable("onnxruntime"):
        import onnxruntime

        return "cuda" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() \
            else "cpu"
    return "cpu"


def _is_loaded_model(obj: Any) -> bool:
    return hasattr(obj, "module") and hasattr(obj, "spec")


def _spec_of(model_or_spec: Any) -> Any:
    return model_or_spec.spec if _is_loaded_model(model_or_spec) else model_or_spec


def _loaded(model_or_spec: Any) -> Any:
    if _is_loaded_model(model_or_spec):
        return model_or_spec
    from stgcnd.model.reference import load_for_inference

    return load_for_inference(model_or_spec)  # without torch: the demo's numpy stand-in


def _options(options: Any) -> Any:
    from stgcnd.engines.options import BuildOptions

    if options is None:
        return BuildOptions()
    if isinstance(options, str):  # backward compatible: open_backend(spec, "auto", "fp16", store)
        return BuildOptions(precision=options)
    return options


def default_store() -> Any:
    from stgcnd.engines import store as store_mod

    root = getattr(store_mod, "DEFAULT_ROOT", None) or os.environ.get(
        "STGCND_ENGINE_DIR", str(Path.home() / ".cache" / "stgcnd" / "engines"))
    return store_mod.EngineStore(Path(root))


def _store_root(store: Any) -> Path:
    return Path(getattr(store, "root", None) or getattr(store, "path", None) or ".")


# --- auto ----------------------------------------------------------------------------------

def machine_key() -> dict[str, Any]:
    from stgcnd.versions import module_version

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu": cpu or platform.processor(),
            "cpus": os.cpu_count(), "torch": module_version("torch"),
            "onnxruntime": module_version("onnxruntime")}


def model_key(model: Any) -> dict[str, Any]:
    spec = model.spec
    return {"checkpoint_sha256": model.checkpoint_sha256, "demo_seed":
            spec.seed if spec.is_demo else None, "input_shape": list(spec.input_shape),
            "motion": spec.motion, "layout": spec.layout}


def _auto_cache_key(model: Any, options: Any) -> str:
    from stgcnd.engines.keys import key_digest

    return key_digest({"model": model_key(model), "machine": machine_key(),
                       "precision": options.precision, "threads": options.threads})


def _probe_ms(backend: Backend, runs: int = AUTO_PROBE_RUNS) -> float:
    from stgcnd.model.synthetic import synthetic_windows

    _c, t, v, m = backend.info.input_shape
    x = synthetic_windows(1, t, m, v, seed=5)
    times = []
    with backend.open_session() as s:
        s.infer(x)  # first run pays one-off allocations
        for _ in range(runs):
            t0 = time.perf_counter()
            s.infer(x)
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def fastest_cpu_backend(model: Any, options: Any, store: Any) -> str:
    """torch or onnxruntime, whichever runs this model faster here; measured once, cached."""
    if options.precision == "int8":
        return "onnxruntime"  # the only CPU backend with INT8
    cache_path = _store_root(store) / AUTO_CACHE_NAME
    key = _auto_cache_key(model, options)
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        log.info("auto_backend_cached", backend=cache[key]["backend"], key=key[:12])
        return str(cache[key]["backend"])
    timings: dict[str, float] = {}
    unavailable = available_backends()
    for name in ("torch", "onnxruntime"):
        if unavailable[name] is not None:  # torch is optional: auto runs without it
            log.info("auto_backend_skipped", backend=name, reason=unavailable[name])
            continue
        try:
            backend = _load(model, name, options, store)
        except BackendUnavailable as exc:
            log.info("auto_backend_skipped", backend=name, reason=str(exc))
            continue
        try:
            timings[name] = _probe_ms(backend)
        finally:
            backend.close()
    if not timings:
        raise BackendUnavailable("no CPU backend can run here; pip install onnxruntime")
    best = min(timings, key=timings.__getitem__)
    cache[key] = {"backend": best, "median_ms": timings, "machine": machine_key(),
                  "model": model_key(model), "precision": options.precision,
                  "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        atomic_write_json(cache_path, cache)
    except OSError as exc:  # a read-only store: measure again next start, serve now
        log.warning("auto_backend_not_cached", path=str(cache_path), error=exc.strerror)
    log.info("auto_backend_measured", backend=best, **{f"{k}_ms": round(v, 2)
                                                       for k, v in timings.items()})
    return best


def resolve_auto(model_or_spec: Any, options: Any, store: Any) -> tuple[str, Any]:
    """(backend, options with the device it runs on) for backend="auto"."""
    if available_backends()["tensorrt"] is None:
        return "tensorrt", dataclasses.replace(options, device="cuda")
    if torch_cuda_available():
        precision = "fp16" if options.precision == "int8" else options.precision
        if precision != options.precision:
            log.warning("precision_fallback", backend="torch", asked=options.precision,
                        using=precision)
        return "torch", dataclasses.replace(options, device="cuda", precision=precision)
    cpu_options = dataclasses.replace(options, device="cpu", cuda_graph=False)
    if cpu_options.precision == "fp16":
        log.warning("precision_fallback", backend="cpu", asked="fp16", using="fp32",
                    reason="no GPU; CPU backends run fp32 (or int8 with onnxruntime)")
        cpu_options = dataclasses.replace(cpu_options, precision="fp32")
    model = _loaded(model_or_spec)
    return fastest_cpu_backend(model, cpu_options, store), cpu_options


# --- loading -------------------------------------------------------------------------------

def _prepare(model_or_spec: Any, backend: str, options: Any, store: Any,
             rebuild: str | None = None) -> Any:
    """The store's artefact; from the manifest alone (no torch) when already built."""
    if rebuild is not None:
        return store.prepare(model_or_spec, backend, options, rebuild=rebuild)
    if backend == "tensorrt" and not _is_loaded_model(model_or_spec):
        find = getattr(store, "find", None)
        if find is not None:
            artifact = find(model_or_spec, backend, options)
            if artifact is not None:
                return artifact
    # The store loads the model (torch) only if it must export or build.
    return store.prepare(model_or_spec, backend, options)


def _first_line(text: str, limit: int = 300) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _load_artifact(model_or_spec: Any, backend: str, options: Any, store: Any,
                   load: Any) -> Backend:
    """load(artifact); a stored artefact that fails to load is rebuilt once.

    A file can match its manifest and still not load: a TensorRT engine after a driver or
    library change that the key did not see, an ONNX that this runtime rejects. Rebuilding
    is the fix the user would apply, so the store does it, with the reason in
    `engine_rebuilt`; a rebuilt artefact that fails too is one clear error, not a traceback.
    """
    artifact = _prepare(model_or_spec, backend, options, store)
    try:
        return load(artifact)
    except BackendUnavailable:
        raise  # the runtime is missing or lacks the device: a rebuild cannot help
    except Exception as exc:
        if not artifact.reused:
            raise _load_failure(backend, artifact, exc) from None
        reason = f"failed to load: {_first_line(str(exc)) or type(exc).__name__}"
        log.warning("engine_load_failed", backend=backend, path=str(artifact.path),
                    error=_first_line(str(exc)), action="rebuilding it once")
    artifact = _prepare(model_or_spec, backend, options, store, rebuild=reason)
    try:
        return load(artifact)
    except BackendUnavailable:
        raise
    except Exception as exc:
        raise _load_failure(backend, artifact, exc) from None


def _load_failure(backend: str, artifact: Any, exc: BaseException) -> UserError:
    return UserError(f"the {backend} {artifact.precision} artefact {artifact.path} fails to "
                     f"load just after it was built: {_first_line(str(exc)) or type(exc).__name__}"
                     "; check the runtime install with `stgcnd doctor`, or try another "
                     "backend/precision")


def _load(model_or_spec: Any, backend: str, options: Any, store: Any) -> Backend:
    if backend == "tensorrt":
        from stgcnd.backends.tensorrt_backend import (
            TensorRTBackend,
            import_tensorrt,
            serving_options,
        )

        # A clear error before any export/build work; fp16 on TensorRT 11 serves fp32.
        options = serving_options(import_tensorrt(), options)
        return _load_artifact(model_or_spec, backend, options, store,
                              lambda a: TensorRTBackend.from_artifact(
                                  a, cuda_graph=options.cuda_graph))
    if backend == "onnxruntime":
        from stgcnd.backends.onnxruntime_backend import OnnxRuntimeBackend

        return _load_artifact(model_or_spec, backend, options, store,
                              lambda a: OnnxRuntimeBackend.from_artifact(
                                  a, threads=options.threads, device=options.device))
    if backend == "noop":
        from stgcnd.backends.noop_backend import NoopBackend

        # No artefact and no store: the spec's shape is all it needs (see noop_backend).
        return NoopBackend.from_spec(_spec_of(model_or_spec), max_batch=options.max_batch,
                                     precision=options.precision)
    if backend == "torch":
        from stgcnd.backends.torch_backend import TorchBackend

        model = _loaded(model_or_spec)
        if options.precision == "int8":
            raise BackendUnavailable("the torch backend has no int8; use onnxruntime or "
                                     "tensorrt for --precision int8")
        store.prepare(model, backend, options)  # manifest: key + validation record
        return TorchBackend(model, options.precision, options.device,
                            cuda_graph=options.cuda_graph, max_batch=options.max_batch,
                            threads=options.threads)
    raise UserError(f"unknown backend {backend!r}; choose auto, {', '.join(BACKENDS)}")


def open_backend(model_or_spec: Any, backend: str = "auto", options: Any = None,
                 store: Any = None) -> Backend:
    """Prepare (export/build or reuse) the artefact and load it; sessions come from the result."""
    options = _options(options)
    store = store if store is not None else default_store()
    if backend == "auto":
        backend, options = resolve_auto(model_or_spec, options, store)
        log.info("auto_backend", backend=backend, device=options.device,
                 precision=options.precision)
    elif backend == "tensorrt" and options.device != "cuda":
        options = dataclasses.replace(options, device="cuda")
    reason = available_backends().get(backend, f"unknown backend {backend!r}")
    if reason is not None:
        raise BackendUnavailable(f"backend {backend} cannot run here: {reason}")
    return _load(model_or_spec, backend, options, store)
