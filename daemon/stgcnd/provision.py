"""Provisioning a served model: which runtime runs it, its artefact built or reused, loaded.

`first_that_serves(spec, backend, options, store, use)` is the one walk of the choices, made
by the daemon, `build` and `validate` (`open_runtime`: it, for a loaded runtime); `bench`
loads each named runtime with `load_runtime`. "auto" is TensorRT where it imports and a GPU
answers, else torch on CUDA, else the faster CPU runtime, timed and remembered in the store
(the winner, as timed, is the one served). The TensorRT path never imports torch when its
engine is built.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, Union

from stgcnd.engines.builders import get_builder
from stgcnd.engines.keys import key_digest
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import Artifact, EngineStore
from stgcnd.errors import (
    BackendUnavailable,
    BuildCancelled,
    UserError,
    at_step,
    first_line,
    step_of,
)
from stgcnd.fsutil import atomic_write_json, read_system_file
from stgcnd.log import get_logger
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.runtimes import (
    NAMES,
    available,
    cpu_bf16,
    gpu_present,
    import_onnxruntime,
    import_tensorrt,
    runtime_module,
    torch_cuda_available,
)
from stgcnd.runtimes.base import Runner, Runtime
from stgcnd.runtimes.timing import time_round_robin
from stgcnd.versions import module_version

log = get_logger(__name__)

AUTO_CACHE_NAME = "auto-backend.json"
AUTO_ROUNDS = 5   # interleaved rounds of the CPU choice; each runtime's fastest round counts

# A model as the caller has it: a ModelSpec, or a loaded model (torch or the numpy demo).
ModelLike = Union[ModelSpec, Any]
T = TypeVar("T")


def _is_loaded(model: ModelLike) -> bool:
    return hasattr(model, "spec") and hasattr(model, "num_class")


def spec_of(model: ModelLike) -> ModelSpec:
    if isinstance(model, ModelSpec) or not _is_loaded(model):  # a ModelSpec is never loaded
        return model
    return model.spec


def loaded(model: ModelLike, store: EngineStore, options: BuildOptions) -> Any:
    """The model loaded (torch), or its stand-in where torch is absent (engines/exported.py)."""
    return model if _is_loaded(model) else store.load(model, options.dynamic_batch)


def default_device(backend: str) -> str:
    """Where an explicitly named runtime runs when the user did not say: the GPU if it can."""
    if backend == "tensorrt":
        return "cuda"
    if backend == "torch":
        return "cuda" if torch_cuda_available() else "cpu"
    if backend == "onnxruntime" and available()["onnxruntime"] is None:
        providers = import_onnxruntime().get_available_providers()
        return "cuda" if "CUDAExecutionProvider" in providers else "cpu"
    return "cpu"


def serving_options(options: BuildOptions) -> BuildOptions:
    """The TensorRT options the daemon serves with here. A configuration written for
    JetPack 6 says fp16; TensorRT 11 builds strongly typed networks and has no FP16 flag,
    so that precision cannot be built from stgcnd's fp32 ONNX: the daemon serves fp32 and
    says so once (`precision_fallback`), rather than refusing to start."""
    if options.precision != "fp16":
        return options
    trt = import_tensorrt()
    try:  # the builder's own check (get_builder: TensorRT's modules load only for TensorRT)
        get_builder("tensorrt").check(options)
    except UserError as exc:
        log.warning("precision_fallback", backend="tensorrt", asked="fp16", using="fp32",
                    tensorrt=str(getattr(trt, "__version__", "?")), reason=str(exc))
        return dataclasses.replace(options, precision="fp32")
    return options


# --- loading -------------------------------------------------------------------------------

def _load_artifact(model: ModelLike, backend: str, options: BuildOptions,
                   store: EngineStore, before_load: Callable[[], None]
                   ) -> Runtime:
    """The stored artefact, loaded; one that fails to load is rebuilt once.

    A file can match its manifest and still not load: a TensorRT engine after a driver or
    library change that the key did not see, an ONNX that this runtime rejects. Rebuilding is
    the fix the user would apply, so the store does it, with the reason in `engine_rebuilt`;
    a rebuilt artefact that fails too is one clear error, not a traceback.
    """
    with at_step("build"):
        artifact = (store.find(spec_of(model), backend, options)
                    if backend == "tensorrt" and not _is_loaded(model) else None)
        if artifact is None:  # the store loads the model (torch) only if it must build
            artifact = store.prepare(model, backend, options)
    try:
        with at_step("load"):
            before_load()
            return get_builder(backend).open(artifact, options, model, store.root)
    except BackendUnavailable:
        raise  # the runtime is missing or lacks the device: a rebuild cannot help
    except Exception as exc:
        if not artifact.reused:
            raise _load_failure(backend, artifact, exc) from None
        reason = f"failed to load: {first_line(str(exc)) or type(exc).__name__}"
        log.warning("engine_load_failed", backend=backend, path=str(artifact.path),
                    error=first_line(str(exc)), action="rebuilding it once")
    with at_step("build"):
        artifact = store.prepare(model, backend, options, rebuild=reason)
    with at_step("load"):
        try:
            before_load()
            return get_builder(backend).open(artifact, options, model, store.root)
        except BackendUnavailable:
            raise
        except Exception as exc:
            raise _load_failure(backend, artifact, exc) from None


def _load_failure(backend: str, artifact: Artifact, exc: BaseException) -> UserError:
    return UserError(f"the {backend} {artifact.precision} artefact {artifact.path} fails to "
                     f"load just after it was built: {first_line(str(exc)) or type(exc).__name__}"
                     "; check the runtime install with `stgcnd doctor`, or try another "
                     "backend/precision")


def load_runtime(model: ModelLike, backend: str, options: BuildOptions,
                 store: EngineStore, noop_compute_us: int = 0,
                 before_load: Callable[[], None] | None = None) -> Runtime:
    """Load `model` into the named runtime (no "auto"), building its artefact if needed.
    Exceptions say at which step they happened (errors.step_of). `before_load` is called
    once the artefact exists, right before it is loaded (the memory plan measures from
    there: a build's page cache and libraries are not the model's cost)."""
    before_load = before_load or (lambda: None)
    reason = available().get(backend, f"unknown backend {backend!r}")
    if reason is not None:
        with at_step("import"):
            raise BackendUnavailable(f"backend {backend} cannot run here: {reason}")
    if backend == "tensorrt":
        # A clear error before any export/build work; fp16 on TensorRT 11 serves fp32.
        with at_step("import"):
            options = serving_options(options)
        return _load_artifact(model, backend, options, store, before_load)
    if backend == "onnxruntime":
        return _load_artifact(model, backend, options, store, before_load)
    if backend == "noop":
        # No artefact and no store: the spec's shape is all it needs (runtimes/noop.py).
        return runtime_module("noop").NoopRuntime.from_spec(
            spec_of(model), max_batch=options.max_batch, precision=options.precision,
            compute_us=noop_compute_us)
    if backend == "torch":
        with at_step("build"):
            if options.precision == "int8":
                raise BackendUnavailable("the torch backend has no int8; use onnxruntime or "
                                         "tensorrt for int8")
            model = loaded(model, store, options)
            if getattr(model, "module", None) is None:
                raise BackendUnavailable(
                    "the torch backend runs the PyTorch checkpoint; this model is known by its "
                    "exported ONNX only (serve it with tensorrt or onnxruntime)")
            artifact = store.prepare(model, backend, options)  # key + validation record
        with at_step("load"):
            before_load()
            return get_builder(backend).open(artifact, options, model, store.root)
    raise UserError(f"unknown backend {backend!r}; choose auto, {', '.join(NAMES)}")


def named_options(backend: str, options: BuildOptions) -> BuildOptions:
    """The options a named runtime runs with (TensorRT always on the GPU)."""
    if backend == "tensorrt" and options.device != "cuda":
        return dataclasses.replace(options, device="cuda")
    return options


def open_runtime(model: ModelLike, backend: str, options: BuildOptions,
                 store: EngineStore, noop_compute_us: int = 0) -> Runtime:
    """Prepare (export/build or reuse) the artefact and load it; runners come from it. For
    "auto", the first runtime of the chain that loads (first_that_serves)."""
    return first_that_serves(model, backend, options, store,
                             lambda choice: choice.load(model, store, noop_compute_us))[0]


def first_that_serves(model: ModelLike, backend: str, options: BuildOptions,
                      store: EngineStore, use: Callable[[Choice], T]) -> tuple[T, Choice]:
    """`use` of the first choice it succeeds on, and that choice: the one walk of the auto
    chain, for the daemon (its `use` also makes and warms the runners), `build` and
    `validate`. A named backend is its only choice and its failure is raised as it is; with
    "auto" each failure is logged (`backend_fallback`) and the next choice tried, and a
    chain that runs out raises one UserError that lists them. A runtime opened while choosing
    and not taken by `use` (Choice.load) is closed."""
    if backend != "auto":
        choice = Choice(backend, named_options(backend, options), "named")
        return use(choice), choice
    failures = []
    try:
        for choice in auto_chain(model, options, store):
            try:
                used = use(choice)
            except (BuildCancelled, KeyboardInterrupt):
                raise
            except Exception as exc:
                failures.append(fallback(choice, exc))
                continue
            finally:
                choice.close()
            log.info("auto_backend", backend=choice.backend, device=choice.options.device,
                     precision=choice.options.precision, why=choice.why)
            return used, choice
    except UserError as exc:  # the chain itself failed: e.g. no CPU runtime loads the model
        if "stgcnd_step" in exc.__dict__:
            raise
        failures.append(str(exc))
    raise no_runtime_left(failures)


# --- auto ----------------------------------------------------------------------------------

def machine_key() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in (
        read_system_file(Path("/proc/cpuinfo")) or "").splitlines()
        if line.startswith("model name")), "")
    return {"machine": platform.machine(), "cpu": cpu or platform.processor(),
            "cpus": os.cpu_count(), "torch": module_version("torch"),
            "onnxruntime": module_version("onnxruntime")}


def model_key(model: Any) -> dict[str, Any]:
    spec = model.spec
    return {"checkpoint_sha256": model.checkpoint_sha256, "demo_seed":
            spec.seed if spec.is_demo else None, "input_shape": list(spec.input_shape),
            "motion": spec.motion, "layout": spec.layout}


def time_runtimes(runtimes: dict[str, Runtime], rounds: int = AUTO_ROUNDS) -> dict[str, float]:
    """Batch-1 milliseconds of each runtime through its runner: the fastest of `rounds`
    round-robin rounds (runtimes/timing.py, as `stgcnd bench` measures)."""
    runners: list[Runner] = []
    try:
        for rt in runtimes.values():
            runners.append(rt.open_runner((1,), 0))
        _c, t, v, m = next(iter(runtimes.values())).info.input_shape
        x = synthetic_windows(1, t, m, v, seed=5)
        timed = time_round_robin(runners, x, rounds, warmup=1)  # warm-up: one-off allocations
        return {name: min(times) for name, (times, _out, _parts) in zip(runtimes, timed)}
    finally:
        for runner in runners:
            runner.close()


# On a CPU, `precision` is the lowest the user allows; auto measures every runtime and
# precision down to it that can run here and serves the fastest. bf16 only where the CPU does
# it natively (emulated, it is slower than fp32).
_CPU_CANDIDATES = {"fp32": (("torch", "fp32"), ("onnxruntime", "fp32")),
                   "bf16": (("torch", "fp32"), ("onnxruntime", "fp32"), ("torch", "bf16"))}
_CPU_CANDIDATES["fp16"] = _CPU_CANDIDATES["bf16"]
_CPU_CANDIDATES["int8"] = (*_CPU_CANDIDATES["bf16"], ("onnxruntime", "int8"))


def fastest_cpu_runtime(model: Any, options: BuildOptions, store: EngineStore
                        ) -> tuple[str, str, str, Runtime | None]:
    """(runtime, precision, why, loaded): the fastest here of the CPU runtimes and precisions
    that `options.precision` allows; measured once, cached in the store. `loaded` is the
    winner as it was measured (left open, so that it is not loaded twice), None when the
    choice came from the cache."""
    cache_path = store.root / AUTO_CACHE_NAME
    # int8's candidate loads or not by its calibration: a new file (or synthetic calibration
    # allowed) measures again.
    int8 = ({"calibration": options.key_dict("onnxruntime").get("calibration_sha256"),
             "synthetic": options.allow_synthetic_calibration}
            if options.precision == "int8" else None)
    key = key_digest({"model": model_key(model), "machine": machine_key(),
                      "allowed": options.precision, "threads": options.threads, "int8": int8,
                      "v": 2})
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache and not store.remeasure_auto:
        entry = cache[key]
        log.info("auto_backend_cached", backend=entry["backend"], precision=entry["precision"],
                 key=key[:12])
        return (str(entry["backend"]), str(entry["precision"]), _faster(entry["fastest_ms"]),
                None)
    candidates: dict[str, Runtime] = {}
    winner: Runtime | None = None
    unavailable = available()
    bf16 = cpu_bf16()
    try:
        for name, precision in _CPU_CANDIDATES[options.precision]:
            label = f"{name} {precision}"
            reason = unavailable[name] or (None if precision != "bf16" or bf16 else
                                           "this CPU has no bf16 instructions (AVX512-BF16, "
                                           "AMX or Arm BF16)")
            if reason is None:
                try:
                    candidates[label] = load_runtime(
                        model, name, dataclasses.replace(options, precision=precision), store)
                except Exception as exc:  # any candidate may fail: the others still serve
                    reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:  # torch is optional, int8 may lack calibration: go on
                log.info("auto_backend_skipped", backend=name, precision=precision,
                         reason=reason)
        if not candidates:
            raise BackendUnavailable("no CPU runtime can run here; pip install onnxruntime")
        timings = _time_each_that_runs(candidates)
        best = min(timings, key=timings.__getitem__)
        winner = candidates.pop(best)
    finally:
        for runtime in candidates.values():
            runtime.close()
    backend, precision = best.split()
    cache[key] = {"backend": backend, "precision": precision, "allowed": options.precision,
                  "fastest_ms": timings, "machine": machine_key(), "model": model_key(model),
                  "cpu_bf16": bf16, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        atomic_write_json(cache_path, cache)
    except OSError as exc:  # a read-only store: measure again next start, serve now
        log.warning("auto_backend_not_cached", path=str(cache_path), error=exc.strerror)
    log.info("auto_backend_measured", backend=backend, precision=precision,
             allowed=options.precision, cpu_bf16=bf16, rounds=AUTO_ROUNDS,
             **{f"{k.replace(' ', '_')}_ms": round(v, 2) for k, v in timings.items()})
    return backend, precision, _faster(timings), winner


def _time_each_that_runs(candidates: dict[str, Runtime]) -> dict[str, float]:
    """time_runtimes over all candidates; where one fails, each alone, without the failures."""
    try:
        return time_runtimes(candidates)
    except Exception as exc:
        log.warning("auto_backend_timing_failed", error=f"{type(exc).__name__}: {exc}",
                    action="timing each candidate alone")
    timings: dict[str, float] = {}
    for label, runtime in candidates.items():
        try:
            timings.update(time_runtimes({label: runtime}))
        except Exception as exc:
            backend, precision = label.split()
            log.info("auto_backend_skipped", backend=backend, precision=precision,
                     reason=f"{type(exc).__name__}: {exc}")
    if not timings:
        raise BackendUnavailable("no CPU runtime ran a window here (auto_backend_skipped "
                                 "lines say why)")
    return timings


def _faster(timings: dict[str, float]) -> str:
    """"the fastest here (onnxruntime fp32 2.10 ms, torch fp32 3.40 ms per window)"."""
    shown = ", ".join(f"{k} {v:.2f} ms" for k, v in sorted(timings.items(),
                                                           key=lambda kv: kv[1]))
    return f"the fastest here ({shown} per window)" if len(timings) > 1 else \
        "the only CPU runtime here"


@dataclasses.dataclass
class Choice:
    """One runtime of the auto chain, the options it runs with, and why it is tried."""

    backend: str
    options: BuildOptions
    why: str
    # Loaded while choosing (auto on a CPU measures its candidates): served, not loaded again.
    opened: Runtime | None = dataclasses.field(default=None, repr=False)

    def load(self, model: ModelLike, store: EngineStore, noop_compute_us: int = 0,
             before_load: Callable[[], None] | None = None) -> Runtime:
        """The runtime of this choice, the caller's to close: the one opened while choosing,
        else load_runtime's."""
        runtime, self.opened = self.opened, None
        if runtime is not None:
            return runtime
        return load_runtime(model, self.backend, self.options, store, noop_compute_us,
                            before_load)

    def close(self) -> None:
        """Close the runtime opened while choosing, if nobody took it."""
        runtime, self.opened = self.opened, None
        if runtime is not None:
            runtime.close()


def auto_chain(model: ModelLike, options: BuildOptions, store: EngineStore
               ) -> Iterator[Choice]:
    """backend "auto": tensorrt, then torch on CUDA, then the CPU runtimes (the faster here
    first). A runtime that cannot run here is skipped with its reason logged (warning level
    when a GPU is present: there a missing CUDA binding is a problem, not a fact). The caller
    tries each in turn and logs each failure (`backend_fallback`)."""
    gpu = gpu_present()
    unavailable = available()
    trt_skipped = unavailable["tensorrt"]
    if trt_skipped is None:
        yield Choice("tensorrt", dataclasses.replace(options, device="cuda"),
                     "the first choice on a GPU")
    else:
        _skipped("tensorrt", trt_skipped, gpu)
    torch_skipped = unavailable["torch"] or (
        None if torch_cuda_available() else "torch has no CUDA here (a CPU build, or no GPU)")
    if torch_skipped is None:
        precision = "fp16" if options.precision == "int8" else options.precision
        if precision != options.precision:
            log.warning("precision_fallback", backend="torch", asked=options.precision,
                        using=precision, reason="torch has no int8")
        yield Choice("torch", dataclasses.replace(options, device="cuda", precision=precision),
                     "on CUDA, " + (f"as tensorrt cannot run here ({trt_skipped})"
                                    if trt_skipped else "after tensorrt failed"))
    else:
        _skipped("torch (CUDA)", torch_skipped, gpu)
    cpu_options = dataclasses.replace(options, device="cpu", cuda_graph=False,
                                      compile="off")
    first, precision, why, opened = fastest_cpu_runtime(loaded(model, store, cpu_options),
                                                        cpu_options, store)
    if precision != options.precision:
        log.warning("precision_fallback", backend=first, asked=options.precision,
                    using=precision, reason=f"on this CPU: {why}")
    yield Choice(first, dataclasses.replace(cpu_options, precision=precision), why, opened)
    fp32 = dataclasses.replace(cpu_options, precision="fp32")
    for other in ("torch", "onnxruntime"):
        if unavailable[other] is None and (other, "fp32") != (first, precision):
            yield Choice(other, fp32, f"fp32 on the CPU ({first} {precision} failed)")


def _skipped(runtime: str, reason: str, gpu: bool) -> None:
    if gpu:  # a GPU that a runtime cannot use is worth a warning (a missing CUDA binding)
        log.warning("backend_fallback", runtime=runtime, step="import", reason=reason)
    else:
        log.info("backend_skipped", runtime=runtime, reason=reason)


def fallback(choice: Choice, exc: BaseException) -> str:
    """Log one runtime's failure (one line, no traceback); returns it for the final error."""
    step, reason = step_of(exc), first_line(str(exc)) or type(exc).__name__
    log.warning("backend_fallback", runtime=choice.backend, step=step, reason=reason,
                error_type=type(exc).__name__)
    return f"{choice.backend} at {step}: {reason}"


def no_runtime_left(failures: list[str]) -> UserError:
    return UserError("no runtime could serve this model: " + "; ".join(failures) +
                     ". `stgcnd doctor` checks the installs")
