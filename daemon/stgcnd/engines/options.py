"""How an artefact is built: the options that the engine store keys artefacts on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stgcnd.errors import UserError
from stgcnd.runtimes.base import normalize_buckets

PRECISIONS = ("fp32", "fp16", "bf16", "int8")  # bf16: the torch runtime on a CPU
DEVICES = ("cpu", "cuda")
BACKENDS = ("tensorrt", "torch", "onnxruntime")
# "qdq": explicit quantization (a Q/DQ ONNX made by stgcnd from calibration windows; every
# TensorRT >= 8.5 and ONNX Runtime run it). "calibrator": TensorRT's implicit INT8 calibration
# with an entropy calibrator, only where TensorRT still offers it (<= 10.x).
INT8_MODES = ("qdq", "calibrator")
# The batch shapes prepared (a batch runs in the smallest that holds it): TensorRT's
# optimization profiles, the memory plan's buckets and the runners' are these, cut by
# max_batch (the [[models]] key `buckets`).
DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class BuildOptions:
    precision: str = "fp32"
    max_batch: int = 1
    # True iff max_batch > 1 unless given: a dynamic batch axis with an optimization profile
    # 1..max_batch; a static batch of 1 otherwise (the fastest engine for one camera).
    dynamic_batch: bool = None  # type: ignore[assignment]
    workspace_mb: int = 1024
    opt_level: int = 3
    calibration: Path | str | None = None  # a str is made a Path by __post_init__
    allow_synthetic_calibration: bool = False
    device: str = "cpu"
    threads: int = 0
    cuda_graph: bool = False
    compile: str = "off"  # the torch runtime on CUDA: runtimes/torch_compile.py
    # torch on CUDA: compiled kernels dynamic in the batch, not one compile per bucket (what
    # serves at once while the buckets are tuned: server/serve_now.py).
    dynamic_kernels: bool = False
    layer_info: bool = False
    int8_mode: str = "qdq"
    # Runners sharing the engine (the model's `instances`): TensorRT lets an optimization
    # profile serve one execution context at a time, so the engine carries one set of
    # profiles per instance (and a dynamic batch axis, even for max_batch 1).
    instances: int = 1
    buckets: tuple[int, ...] = DEFAULT_BUCKETS  # normalized by __post_init__ (max_batch)
    # Filled in by the store, not by users: sha256 of the calibration data (see key_dict).
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.dynamic_batch is None:
            object.__setattr__(self, "dynamic_batch", self.max_batch > 1 or self.instances > 1)
        if self.calibration is not None and not isinstance(self.calibration, Path):
            object.__setattr__(self, "calibration", Path(self.calibration))
        object.__setattr__(self, "buckets", normalize_buckets(self.buckets, self.max_batch))
        if self.precision not in PRECISIONS:
            raise UserError(f"unknown precision {self.precision!r}; choose one of "
                            f"{', '.join(PRECISIONS)}")
        if self.device not in DEVICES:
            raise UserError(f"unknown device {self.device!r}; choose one of {', '.join(DEVICES)}")
        if self.int8_mode not in INT8_MODES:
            raise UserError(f"unknown INT8 mode {self.int8_mode!r}; choose one of "
                            f"{', '.join(INT8_MODES)}")
        if self.max_batch < 1:
            raise UserError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.max_batch > 1 and not self.dynamic_batch:
            raise UserError(f"max_batch {self.max_batch} needs a dynamic batch axis; leave "
                            "dynamic_batch unset or use max_batch 1")
        if not 0 <= self.opt_level <= 5:
            raise UserError(f"--opt-level must be 0..5 (TensorRT builder optimization level), "
                            f"got {self.opt_level}")
        if self.instances < 1:
            raise UserError(f"instances must be >= 1, got {self.instances}")
        if self.workspace_mb < 1:
            raise UserError(f"--workspace-mb must be >= 1, got {self.workspace_mb}")

    @property
    def batch_tag(self) -> str:
        """Part of the artefact's file name: b1 (static) or b1-8 (dynamic 1..8)."""
        return f"b1-{self.max_batch}" if self.dynamic_batch else "b1"

    def key_dict(self, backend: str | None = None) -> dict[str, Any]:
        """The options that change what gets built, for the cache key.

        Runtime-only options (threads, cuda_graph, compile, dynamic_kernels) are left out:
        changing them must not rebuild; but torch's max-autotune, whose buckets are tried at
        build, is kept.
        With `backend`, options that backend ignores are left out too, so that e.g. a new
        --workspace-mb does not rebuild an ONNX Runtime model.
        """
        key: dict[str, Any] = {"precision": self.precision, "max_batch": self.max_batch,
                               "dynamic_batch": self.dynamic_batch, "device": self.device}
        if self.precision == "int8":
            key["int8_mode"] = self.int8_mode
            if backend == "onnxruntime" and self.device == "cpu":  # quantize.quantize_for_cpu
                key["int8_mode"] = "cpu-u8s8"
            # The data, not its path: moving the file keeps the artefact, new data rebuilds it.
            key["calibration_sha256"] = self.extra.get("calibration_sha256")
            key["synthetic_calibration"] = self.calibration is None
        if backend == "torch" and self.compile == "max-autotune" and self.device == "cuda":
            # Which buckets serve autotuned kernels is tried at build (builders/torch.py).
            key.update(compile=self.compile, buckets=list(self.buckets))
        if backend in (None, "tensorrt"):
            key.update(workspace_mb=self.workspace_mb, opt_level=self.opt_level,
                       layer_info=self.layer_info,
                       # One optimization profile per batch bucket (the batched executors'
                       # contexts), for each of `instances` runners.
                       profiles=list(self.buckets), profile_sets=self.instances)
        return key
