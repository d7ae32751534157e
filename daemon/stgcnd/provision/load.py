"""A model loaded into one named runtime, its artefact built or reused (`load_runtime`: the
daemon's `Choice.load`, `build`, `validate`, `bench`); TensorRT's path never imports torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Union

from stgcnd.engines.builders import get_builder
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import Artifact, EngineStore
from stgcnd.errors import BackendUnavailable, UserError, at_step, first_line
from stgcnd.log import get_logger
from stgcnd.model.spec import ModelSpec
from stgcnd.runtimes import NAMES, available, import_tensorrt, runtime_module
from stgcnd.runtimes.base import Runtime

log = get_logger("stgcnd.provision")  # the logger name its lines have always had

# A model as the caller has it: a ModelSpec, or a loaded model (torch or the numpy demo).
ModelLike = Union[ModelSpec, Any]


def _is_loaded(model: ModelLike) -> bool:
    return hasattr(model, "spec") and hasattr(model, "num_class")


def spec_of(model: ModelLike) -> ModelSpec:
    if isinstance(model, ModelSpec) or not _is_loaded(model):  # a ModelSpec is never loaded
        return model
    return model.spec


def loaded(model: ModelLike, store: EngineStore, options: BuildOptions) -> Any:
    """The model loaded (torch), or its stand-in where torch is absent (engines/exported.py)."""
    return model if _is_loaded(model) else store.load(model, options.dynamic_batch)


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

