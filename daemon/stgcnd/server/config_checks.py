"""Every check of a configuration that needs no model loaded: run by `config check`, by
`serve` before anything loads and by a reload, so that what passes `check` is served (#32)."""

from __future__ import annotations

from collections.abc import Callable

from stgcnd.errors import UserError
from stgcnd.model.spec import ModelSpec, check_labels
from stgcnd.runtimes import available, gpu_present
from stgcnd.server.config import Config, ModelConfig, check_files
from stgcnd.server.curve_policy import check_security
from stgcnd.server.transport import parse_endpoint

# The precisions each named runtime serves (runtimes/*, engines/builders/*).
PRECISIONS = {"tensorrt": ("fp32", "fp16", "int8"), "torch": ("fp32", "fp16", "bf16"),
              "onnxruntime": ("fp32", "int8")}
OTHER_BACKEND = {"fp16": 'backend = "tensorrt" or "torch" (on CUDA)',
                 "bf16": 'backend = "torch" (on a CPU with AVX512-BF16 or AMX)',
                 "int8": 'backend = "onnxruntime" or "tensorrt" (with calibration)'}
UNCALIBRATED = ('precision = "int8" needs calibration windows: set calibration = '
                '"/path/windows.npz" (windows recorded from your cameras), or '
                "allow_synthetic_calibration = true (accuracy then unknown), or another "
                'precision ("fp16" on a GPU, else "fp32")')


def check_config(config: Config, read_files: Callable[[ModelConfig], list[str]] | None = None
                 ) -> tuple[str, ...]:
    """Raise UserError naming every problem; return what cannot be checked without loading
    the models (one line each). `read_files`: more problems of a model found by reading its
    files (`config check` passes server/model_files.py's; `serve` finds them when it loads
    the model, without loading onnx or torch for it first)."""
    check_files(config)
    for endpoint in (config.endpoint, config.server.events_endpoint):
        if endpoint:
            parse_endpoint(endpoint, listening=True)
    check_security(config)
    gpu = gpu_present()
    problems = [f"model {m.name!r}: {p}" for m in config.models
                for p in [*_model_problems(m, gpu), *_demo_labels(m),
                          *(read_files(m) if read_files else [])]]
    if problems:
        raise UserError(f"{config.source}: {'; '.join(problems)}")
    return _not_checked(config, gpu)


def _model_problems(mc: ModelConfig, gpu: bool) -> list[str]:
    backend, precision = mc.backend, mc.precision
    if backend == "noop":  # noop computes nothing
        return []
    uncalibrated = precision == "int8" and mc.calibration is None \
        and not mc.allow_synthetic_calibration and (backend == "auto"
                                                    or precision in PRECISIONS[backend])
    if backend == "auto":
        # auto picks what runs here, but not int8 without calibration: its chain would
        # serve another precision, said only in a log line (precision_fallback).
        return [UNCALIBRATED] if uncalibrated else []
    why_not = available().get(backend)
    if why_not is not None:
        return [f'backend = "{backend}" cannot run on this machine: {why_not}; set backend = '
                '"auto" (the fastest runtime that runs here) or install it']
    problems = []
    if mc.device == "cuda" and not gpu:
        problems.append('device = "cuda", but no CUDA GPU answers the driver here; set device '
                        '= "auto" or "cpu"')
    if precision not in PRECISIONS[backend]:
        allowed = " or ".join(f'"{p}"' for p in PRECISIONS[backend])
        problems.append(f'backend = "{backend}" serves precision = {allowed}, not "{precision}";'
                        f" change precision, or use {OTHER_BACKEND[precision]}")
    if uncalibrated:
        problems.append(UNCALIBRATED)
    cpu_only = mc.device == "cpu" or (mc.device == "auto" and not gpu)
    if backend == "torch" and precision == "fp16" and cpu_only:
        problems.append('backend = "torch" runs fp16 on CUDA only and this model runs on the '
                        'CPU; set precision = "fp32" (or "bf16" on a CPU with AVX512-BF16 or '
                        'AMX)')
    if backend == "torch" and precision == "bf16" and mc.device == "cuda":
        problems.append('backend = "torch" runs bf16 on a CPU only; on CUDA set precision = '
                        '"fp16"')
    return problems


def _demo_labels(mc: ModelConfig) -> list[str]:
    """The demo model's labels against its class count (a checkpoint's are read by `config
    check` (server/model_files.py) and by every runtime when it loads: server/models.py)."""
    try:  # the noop backend runs no model: its classes are its labels
        if mc.checkpoint is None and mc.backend != "noop":
            check_labels(mc.labels, ModelSpec().num_class, "the demo model")
    except UserError as exc:
        return [str(exc)]
    return []


def _not_checked(config: Config, gpu: bool) -> tuple[str, ...]:
    out = [f"whether {config.endpoint} is free to listen on (serve checks it at start)"]
    for m in config.models:
        where = f"model {m.name!r}"
        if m.checkpoint:
            out.append(f"{where}: that the checkpoint loads and fits layout, persons and "
                       "frames (and labels its class count, where neither onnx nor torch "
                       "reads its file here)")
        if m.backend == "auto":
            out.append(f"{where}: which runtime backend = \"auto\" serves (it measures them "
                       "at the first start)")
        elif m.backend != "noop":
            out.append(f"{where}: that the {m.backend} engine builds and validates here")
        if gpu and m.backend == "torch" and m.device == "auto":
            out.append(f"{where}: whether this torch sees the GPU (device = \"auto\" runs on "
                       "the CPU otherwise)")
        if m.backend == "onnxruntime" and m.device == "cuda":
            out.append(f"{where}: whether ONNX Runtime has its CUDA provider")
        if m.backend == "tensorrt" and m.precision == "fp16":
            out.append(f"{where}: whether this TensorRT builds fp16 (TensorRT 11 serves fp32)")
    if gpu:
        out.append("whether the models fit the GPU's memory (memory_budget_mb)")
    return tuple(out)
