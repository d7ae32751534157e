"""TensorRT engines from the store's ONNX, for TensorRT 8.5 (JetPack 5), 8.6, 10.x and 11.x.

Every version-dependent choice is a small pure function of the `tensorrt` module (feature
detection), checked against each release's real bindings (tests/engines/test_tensorrt_versions.py).
Never imports torch.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.engines.builders.base import BuildContext, Builder, device_identity
from stgcnd.engines.device import device_slug, runtime_identity
from stgcnd.engines.lock import build_lock
from stgcnd.engines.options import BuildOptions
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.fsutil import atomic_write_bytes, file_sha256
from stgcnd.log import get_logger
from stgcnd.runtimes import import_tensorrt, runtime_module
from stgcnd.runtimes.base import Runtime
from stgcnd.runtimes.cuda import make_current
from stgcnd.runtimes.cuda_batch import DriverMemory
from stgcnd.runtimes.tensorrt_runtime import checked_call, tensorrt_logger, trt_version

log = get_logger(__name__)


# - 8.x (8.5 and 8.6) needs the EXPLICIT_BATCH network flag; 10.x made it the only mode (flag
#   deprecated), 11.x removed it.
# - 10.x removed `build_engine` and `max_workspace_size`: build_serialized_network and the
#   WORKSPACE memory pool (both present since 8.x) are used everywhere.
# - 11.x removed the FP16/INT8 builder flags and implicit INT8 calibration: networks are strongly
#   typed, so a precision comes from the ONNX itself. INT8 works through the Q/DQ ONNX that
#   stgcnd makes (--precision int8); FP16 would need an FP16 ONNX, which stgcnd does not make.
# - IProgressMonitor exists from 10.x and the builder optimization level from 8.6 (8.5 has none);
#   the timing cache (create_timing_cache, set_timing_cache, ITimingCache.combine) since 8.0.
# - Explicit quantization (Q/DQ layers) exists since 8.0 and 8.5's ONNX parser imports
#   QuantizeLinear / DequantizeLinear: the Q/DQ ONNX is built as INT8 from 8.5 on.
# - 8.5 and 8.6 enable the cuBLAS, cuBLASLt and cuDNN tactic sources by default: the build
#   process, and every process that loads the engine, then initialise those libraries, and
#   CUDA 11.4 (JetPack 5) has no lazy loading (~0.8 GB of a Jetson's memory:
#   NVIDIA/TensorRT#2217 logs +182 MB and +241 MB). ST-GCN's convolutions and matmuls run on
#   TensorRT's own kernels, so 8.x builds without them; 10.x turned them off by default (and
#   11.x removed them): its defaults are kept.
# --- version-dependent choices (pure functions of the module) -------------------------------

def has_builder_flag(trt: Any, name: str) -> bool:
    return hasattr(trt.BuilderFlag, name)


def strongly_typed_only(trt: Any) -> bool:
    """11.x: no FP16/INT8 builder flags; precisions come from the network's types."""
    return not has_builder_flag(trt, "FP16") and not has_builder_flag(trt, "INT8")


def network_flags(trt: Any, strongly_typed: bool) -> int:
    flags = 0
    ncf = trt.NetworkDefinitionCreationFlag
    # Required before 10.x; deprecated (always on) in 10.x, where setting it only warns.
    if hasattr(ncf, "EXPLICIT_BATCH") and trt_version(trt)[0] < 10:
        flags |= 1 << int(ncf.EXPLICIT_BATCH)
    if strongly_typed:
        if not hasattr(ncf, "STRONGLY_TYPED"):
            raise UserError(f"TensorRT {trt.__version__} has no strongly typed networks; "
                            "this build needs TensorRT >= 9")
        flags |= 1 << int(ncf.STRONGLY_TYPED)
    return flags


def workspace_api(trt: Any) -> str:
    """'memory_pool' (set_memory_pool_limit, 8.4+) or 'max_workspace_size' (removed in 10)."""
    return ("memory_pool" if hasattr(trt.IBuilderConfig, "set_memory_pool_limit")
            else "max_workspace_size")


def build_api(trt: Any) -> str:
    """'build_serialized_network' (8.0+) or 'build_engine' (removed in 10)."""
    return ("build_serialized_network" if hasattr(trt.Builder, "build_serialized_network")
            else "build_engine")


def supports_opt_level(trt: Any) -> bool:
    return hasattr(trt.IBuilderConfig, "builder_optimization_level")


def supports_progress_monitor(trt: Any) -> bool:
    return hasattr(trt, "IProgressMonitor") and hasattr(trt.IBuilderConfig, "progress_monitor")


def supports_timing_cache(trt: Any) -> bool:
    return (hasattr(trt.IBuilderConfig, "create_timing_cache")
            and hasattr(trt.IBuilderConfig, "set_timing_cache"))


def supports_implicit_int8(trt: Any) -> bool:
    return (has_builder_flag(trt, "INT8") and hasattr(trt, "IInt8EntropyCalibrator2")
            and hasattr(trt.IBuilderConfig, "int8_calibrator"))


EXTERNAL_TACTIC_SOURCES = ("CUBLAS", "CUBLAS_LT", "CUDNN")


def tactic_sources(trt: Any, defaults: int) -> int | None:
    """The tactic-source bits to set on a builder config whose defaults are `defaults`, or
    None to keep them (10.x on): 8.x's defaults less the external libraries that exist in it."""
    if trt_version(trt)[0] >= 10:
        return None
    mask = int(defaults)
    for name in EXTERNAL_TACTIC_SOURCES:
        member = getattr(trt.TacticSource, name, None)
        if member is not None:
            mask &= ~(1 << int(member))
    return mask


def tactic_source_names(trt: Any, mask: int) -> list[str]:
    """The TacticSource names whose bits are set in `mask`, for the manifest."""
    members = getattr(trt.TacticSource, "__members__", {})
    return sorted(name for name, member in members.items() if mask & (1 << int(member)))


def bucket_profiles(buckets: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """One optimization profile (min, opt, max batch) per bucket, tuned at the bucket (opt =
    max = bucket) and covering the batches down to the previous bucket + 1, so the profiles
    are disjoint and every batch 1..max has exactly one. One profile per bucket also lets
    each of the runner's execution contexts own a profile, which TensorRT 8.x requires of
    contexts used concurrently."""
    out, low = [], 1
    for b in sorted(set(buckets)):
        out.append((low, b, b))
        low = b + 1
    return out


def calibration_batching(windows: int, max_batch: int, dynamic: bool) -> tuple[int, int]:
    """(batch, batches) for implicit INT8 calibration.

    TensorRT calibrates a dynamic-shape network at the kOPT shape of the calibration profile
    (its MIN/MAX are overwritten with kOPT), so the calibrator's batch and that profile's opt
    must be the same number: stgcnd makes a profile with min = opt = max = batch. A batch
    never exceeds the windows available, so a few windows still give one batch (not zero);
    leftover windows that do not fill a batch are not used.
    """
    if windows < 1:
        raise UserError("INT8 calibration needs at least one window")
    batch = max(1, min(max_batch, windows)) if dynamic else 1
    return batch, windows // batch


def calibration_cache_name(version: str, onnx_sha256: str, calibration_sha256: str,
                           batch: int) -> str:
    """The entropy-calibration cache's file name. The ONNX *content* hash is in it: a cache
    keeps per-tensor scales by tensor name, and a re-exported model (new checkpoint, same file
    name) would otherwise silently reuse scales learnt on the old weights."""
    return (f"tensorrt-{version}-onnx{onnx_sha256[:12]}-calib{calibration_sha256[:12]}"
            f"-b{batch}.cache")


@dataclass(frozen=True)
class PrecisionPlan:
    """How to build a precision on the installed TensorRT."""

    builder_flags: tuple[str, ...]
    strongly_typed: bool
    onnx: str                     # "fp32" (the exported graph) or "qdq" (the INT8 Q/DQ graph)
    calibrator: bool = False      # implicit INT8 calibration with an entropy calibrator
    notes: tuple[str, ...] = field(default_factory=tuple)


def precision_plan(trt: Any, precision: str, int8_mode: str = "qdq") -> PrecisionPlan:
    """Flags and inputs for `precision`; UserError saying what would make it possible."""
    v = trt.__version__
    typed = strongly_typed_only(trt)
    if precision == "fp32":
        return PrecisionPlan((), typed, "fp32")
    if precision == "fp16":
        if has_builder_flag(trt, "FP16"):
            return PrecisionPlan(("FP16",), False, "fp32")
        raise UserError(
            f"TensorRT {v} builds networks strongly typed (the FP16 builder flag is gone): FP16 "
            "needs an ONNX whose tensors are float16, which stgcnd does not make. Use "
            "--precision int8 (stgcnd makes the Q/DQ ONNX that TensorRT 11 builds as INT8), "
            "--precision fp32, or TensorRT 10.x (JetPack 6) for fp16")
    if precision != "int8":
        raise UserError(f"unknown precision {precision!r}; choose fp32, fp16 or int8")
    if int8_mode == "calibrator":
        if not supports_implicit_int8(trt):
            raise UserError(
                f"TensorRT {v} has no implicit INT8 calibration (removed in 11.x); use "
                "--int8-mode qdq (the default): stgcnd quantizes the ONNX with Q/DQ nodes "
                "from your calibration windows and TensorRT builds that as INT8")
        flags = ("INT8", "FP16") if has_builder_flag(trt, "FP16") else ("INT8",)
        return PrecisionPlan(flags, False, "fp32", calibrator=True)
    if typed:
        return PrecisionPlan((), True, "qdq",
                             notes=("strongly typed: layers outside Q/DQ pairs run fp32",))
    # Weakly typed (8.5, 8.6, 10.x): INT8 lets TensorRT honour the Q/DQ nodes; FP16 lets the
    # layers left in float (the graph step, element-wise ops) run in half precision too.
    flags = ("INT8", "FP16") if has_builder_flag(trt, "FP16") else ("INT8",)
    return PrecisionPlan(flags, False, "qdq")


# --- callbacks: logger, progress, calibrator -------------------------------------------------

def make_logger(trt: Any) -> Any:
    """The process's one TensorRT logger (runtimes.tensorrt_runtime.tensorrt_logger), for builds:
    TensorRT keeps a single logger pointer, so builder and runtime must share it."""
    return tensorrt_logger(trt)


class ProgressSink:
    """A bar on a terminal (stderr); log events otherwise (journald)."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.steps: dict[str, int] = {}
        self.last_log = 0.0

    def start(self, phase: str, parent: str | None, steps: int) -> None:
        self.steps[phase] = steps
        if not self.tty:
            log.info("tensorrt_build_phase", phase=phase, parent=parent, steps=steps)

    def step(self, phase: str, step: int) -> None:
        total = max(1, self.steps.get(phase, 1))
        if self.tty:
            done = int(30 * (step + 1) / total)
            self.stream.write(f"\r{phase[:40]:<40} [{'#' * done}{'.' * (30 - done)}] "
                              f"{step + 1}/{total}")
            self.stream.flush()
        elif time.monotonic() - self.last_log > 5:
            self.last_log = time.monotonic()
            log.info("tensorrt_build_progress", phase=phase, step=step + 1, steps=total)

    def finish(self, phase: str) -> None:
        self.steps.pop(phase, None)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        else:
            log.info("tensorrt_build_phase_done", phase=phase)


def make_progress_monitor(trt: Any, sink: ProgressSink) -> Any:
    class Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int
                        ) -> None:
            sink.start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            sink.step(phase_name, step)
            return True  # False would cancel the build

        def phase_finish(self, phase_name: str) -> None:
            sink.finish(phase_name)

    return Monitor()


def _device_buffer(nbytes: int) -> tuple[int, Callable[[Any], None]]:
    """(device pointer, a function writing a host array into it), through the driver layer.
    TensorRT calls the calibrator in the building thread: the primary context is made
    current there for each call. The buffer lives as long as the build (its own process)."""
    make_current()
    memory = DriverMemory()
    address = memory.device_zeros(nbytes, 0)

    def write(host: Any) -> None:
        make_current()
        memory.upload(address, host)

    return address, write


def make_entropy_calibrator(trt: Any, windows: Any, batch: int, cache_path: Path) -> Any:
    """An IInt8EntropyCalibrator2 over `windows`, `batch` at a time (see
    calibration_batching), with its cache at `cache_path` (TensorRT <= 10)."""

    base = trt.IInt8EntropyCalibrator2

    class Calibrator(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self.windows = np.ascontiguousarray(windows, dtype=np.float32)
            self.pos = 0
            self.ptr: int | None = None
            self.write: Callable[[Any], None] | None = None

        def get_batch_size(self) -> int:
            return batch

        def get_batch(self, names: list[str]) -> list[int] | None:
            if self.pos + batch > len(self.windows):
                return None
            chunk = np.ascontiguousarray(self.windows[self.pos:self.pos + batch])
            self.pos += batch
            if self.ptr is None or self.write is None:  # set together, on the first batch
                self.ptr, self.write = _device_buffer(chunk.nbytes)
            self.write(chunk)
            return [self.ptr]

        def read_calibration_cache(self) -> bytes | None:
            try:
                return cache_path.read_bytes()
            except OSError:
                return None

        def write_calibration_cache(self, cache: Any) -> None:
            atomic_write_bytes(cache_path, bytes(cache))
            log.info("tensorrt_calibration_cache_written", path=str(cache_path))

    return Calibrator()


# --- the builder ------------------------------------------------------------------------------

def _host_bytes(mem: Any) -> bytes:
    return bytes(memoryview(mem))


class TensorRTBuilder(Builder):
    name = "tensorrt"
    suffix = ".engine"

    def device_kind(self, options: BuildOptions) -> str:
        return "cuda"

    def environment(self, options: BuildOptions) -> dict[str, Any]:
        # An engine is tied to the libraries' Debian packages, not only the module's version.
        return {**super().environment(options), "runtime": runtime_identity(self.name)}

    def version(self) -> str | None:
        return str(import_tensorrt().__version__)

    def check(self, options: BuildOptions) -> None:
        precision_plan(import_tensorrt(), options.precision, options.int8_mode)

    def needs_qdq(self, options: BuildOptions) -> bool:
        return options.precision == "int8" and options.int8_mode == "qdq"

    def build(self, ctx: BuildContext, out: Path) -> dict[str, Any]:

        trt = import_tensorrt()
        o = ctx.options
        plan = precision_plan(trt, o.precision, o.int8_mode)
        onnx = ctx.qdq_onnx_path if plan.onnx == "qdq" else ctx.onnx_path
        assert onnx is not None
        logger = make_logger(trt)
        builder = trt.Builder(logger)
        network = builder.create_network(network_flags(trt, plan.strongly_typed))
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise UserError(f"TensorRT {trt.__version__} cannot parse {onnx}: "
                            f"{'; '.join(errors) or 'no details'}; report this with the ONNX")
        config = builder.create_builder_config()
        workspace = o.workspace_mb << 20
        if workspace_api(trt) == "memory_pool":
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace)
        else:
            config.max_workspace_size = workspace
        if supports_opt_level(trt):
            config.builder_optimization_level = o.opt_level
        elif o.opt_level != 3:
            log.warning("tensorrt_opt_level_ignored", version=trt.__version__,
                        reason="builder optimization levels need TensorRT >= 8.6")
        for flag in plan.builder_flags:
            config.set_flag(getattr(trt.BuilderFlag, flag))
        sources = tactic_sources(trt, config.get_tactic_sources())
        if sources is not None and not config.set_tactic_sources(sources):
            raise UserError(f"TensorRT {trt.__version__} refused the tactic sources "
                            f"{tactic_source_names(trt, sources)}; report this with `stgcnd "
                            "doctor` output")
        buckets: tuple[int, ...] = ()
        profiles: list[tuple[int, int, int]] = []
        if o.dynamic_batch:
            buckets = o.buckets
            profiles = bucket_profiles(buckets) * o.instances  # one set per runner
            inp = network.get_input(0)
            rest = tuple(inp.shape)[1:]
            for low, opt, high in profiles:
                profile = builder.create_optimization_profile()
                profile.set_shape(inp.name, (low, *rest), (opt, *rest), (high, *rest))
                if config.add_optimization_profile(profile) < 0:
                    raise UserError(f"TensorRT {trt.__version__} rejected the optimization "
                                    f"profile for batch {low}..{high}; report this with the "
                                    "ONNX and `stgcnd doctor` output")
        if o.layer_info:
            config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
        if supports_progress_monitor(trt):
            config.progress_monitor = make_progress_monitor(trt, ProgressSink())
        device = device_identity("cuda")
        cache_path = ctx.store_root / "timing-cache" / (
            f"tensorrt-{trt.__version__}-{device_slug(device)}.cache")
        timing_cache = None
        if supports_timing_cache(trt):
            try:
                cached = cache_path.read_bytes()
            except OSError:
                cached = b""
            timing_cache = config.create_timing_cache(cached)
            if not config.set_timing_cache(timing_cache, False):
                log.warning("tensorrt_timing_cache_rejected", path=str(cache_path))
                timing_cache = config.create_timing_cache(b"")
                config.set_timing_cache(timing_cache, False)
        calib_cache = None
        calib_batch = 0
        if plan.calibrator:
            assert ctx.calibration is not None  # an int8 build's windows (the store's)
            calib_batch, batches = calibration_batching(len(ctx.calibration), o.max_batch,
                                                        o.dynamic_batch)
            calib_cache = ctx.model_dir / "calibration" / calibration_cache_name(
                trt.__version__, file_sha256(ctx.onnx_path),
                o.extra.get("calibration_sha256") or "synthetic", calib_batch)
            log.info("tensorrt_calibration", batch=calib_batch, batches=batches,
                     windows=len(ctx.calibration), cache=str(calib_cache))
            config.int8_calibrator = make_entropy_calibrator(trt, ctx.calibration, calib_batch,
                                                             calib_cache)
            if o.dynamic_batch:
                # Calibration runs at the calibration profile's kOPT shape: a profile of its
                # own with min = opt = max = the calibrator's batch.
                inp = network.get_input(0)
                shape = (calib_batch, *tuple(inp.shape)[1:])
                calib_profile = builder.create_optimization_profile()
                calib_profile.set_shape(inp.name, shape, shape, shape)
                if not config.set_calibration_profile(calib_profile):
                    raise UserError(f"TensorRT {trt.__version__} rejected the calibration "
                                    f"profile for batch {calib_batch}; try --int8-mode qdq")
        t0 = time.perf_counter()
        built: list[Any] = []

        def run_build() -> bool:
            if build_api(trt) == "build_serialized_network":
                built.append(builder.build_serialized_network(network, config))
            else:
                engine = builder.build_engine(network, config)
                built.append(engine.serialize() if engine is not None else None)
            return built[0] is not None

        try:  # one failure, one line: TensorRT's errors are carried in it, not logged apart
            checked_call(f"{trt.__version__} building a {o.precision} engine",
                         "try a larger --workspace-mb or another precision", run_build)
        except BackendUnavailable as exc:
            raise UserError(str(exc)) from None
        serialized = built[0]
        data = _host_bytes(serialized)
        with open(out, "wb") as f:
            f.write(data)
        extra: dict[str, Any] = {
            "tensorrt": trt.__version__, "flags": list(plan.builder_flags),
            "strongly_typed": plan.strongly_typed, "onnx": plan.onnx,
            "build_api": build_api(trt), "workspace_mb": o.workspace_mb,
            "opt_level": o.opt_level if supports_opt_level(trt) else None,
            "tensorrt_build_seconds": round(time.perf_counter() - t0, 3),
            "calibration_cache": str(calib_cache) if calib_cache else None,
            "calibration_batch": calib_batch or None,
            # Each runner makes one execution context per bucket, bound to a profile of its
            # own set (profile_sets: one per instance).
            "batch_buckets": list(buckets), "profiles": [list(p) for p in profiles],
            "profile_sets": o.instances,
            # Which external libraries loading the engine initialises (none on 8.x: above).
            "tactic_sources": tactic_source_names(trt, config.get_tactic_sources()),
            "notes": list(plan.notes)}
        if timing_cache is not None:
            with build_lock(cache_path.with_suffix(".lock"), cache_path.name):
                self._save_timing_cache(trt, config, cache_path)
            extra["timing_cache"] = str(cache_path)
        if o.layer_info:
            extra["layer_info"] = self._write_layer_info(trt, logger, data, ctx, out)
        return extra

    @staticmethod
    def _save_timing_cache(trt: Any, config: Any, path: Path) -> None:
        """Merge this build's timings into the cache on disk (other builds may have added)."""
        cache = config.get_timing_cache()
        try:
            on_disk = path.read_bytes()
        except OSError:
            on_disk = b""
        if on_disk:
            cache.combine(config.create_timing_cache(on_disk), False)
        try:
            atomic_write_bytes(path, _host_bytes(cache.serialize()))
        except OSError as exc:  # a cache is an optimisation: never fail the build for it
            log.warning("tensorrt_timing_cache_not_saved", path=str(path), error=str(exc))

    @staticmethod
    def _write_layer_info(trt: Any, logger: Any, data: bytes, ctx: BuildContext,
                          out: Path) -> str | None:
        """Per-layer JSON (precision, tactic, fusions) beside the engine."""
        runtime = trt.Runtime(logger)
        engine = runtime.deserialize_cuda_engine(data)
        if engine is None:
            return None
        info = engine.create_engine_inspector().get_engine_information(
            trt.LayerInformationFormat.JSON)
        stem = out.name.split(".tmp-")[0].lstrip(".")
        path = ctx.model_dir / f"{stem}.layers.json"
        atomic_write_bytes(path, info.encode())
        return os.path.relpath(path, ctx.model_dir)

    def open(self, artifact: Any, options: BuildOptions, model: Any, cache: Path) -> Runtime:
        if artifact.path is None:
            raise UserError("the TensorRT artefact has no engine file; rebuild it with "
                            "`stgcnd build --backend tensorrt --rebuild`")
        m = artifact.manifest
        return runtime_module("tensorrt").TensorRTRuntime(
            artifact.path, tuple(m["input_shape"]), int(m["num_class"]),
            int(m.get("max_batch", 1)), artifact.precision, options.cuda_graph)
