"""What the daemon loads for a configured model, (model spec, build options), in one place:
`serve` and `build --config` both call `serving_plan`, so a store `build` prepared holds what
`serve` looks up, for this machine or a board `build --platform/--device` describes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from stgcnd.board import JETSON_MAX_BATCH, JETSON_WORKSPACE_MB, detect
from stgcnd.engines.options import BuildOptions
from stgcnd.errors import UserError
from stgcnd.model.spec import ModelSpec
from stgcnd.provision.load import named_options
from stgcnd.runtimes import available, gpu_present, import_onnxruntime, torch_cuda_available
from stgcnd.server.config import ModelConfig

AUTO_MAX_BATCH_GPU = 64
AUTO_MAX_BATCH_CPU = 16
WORKSPACE_MB = 1024      # TensorRT builder workspace off a Jetson
PLATFORMS = ("here", "jetson", "other")


@dataclass(frozen=True)
class Target:
    """The machine a model is prepared for."""

    jetson: bool
    gpu: bool | None = None  # None: whether a GPU answers the driver here, asked when needed
    here: bool = True        # False: a board described by flags (its runtimes are unknown)

    @classmethod
    @lru_cache(maxsize=None)  # which machine this is (stgcnd/board.py): read once, from files
    def this_machine(cls) -> Target:
        return cls(jetson=detect().jetson)

    @classmethod
    def described(cls, platform: str, device: str | None) -> Target:
        """`build --platform P --device D`: here (D overrides whether it has a GPU), a Jetson
        (its integrated GPU unless D is cpu) or another machine (a GPU only with D cuda)."""
        if platform not in PLATFORMS:
            raise UserError(f"unknown platform {platform!r}; choose one of "
                            f"{', '.join(PLATFORMS)}")
        gpu = None if device is None else device == "cuda"
        if platform == "here":
            return cls(jetson=cls.this_machine().jetson, gpu=gpu)
        if platform == "jetson":
            return cls(jetson=True, gpu=gpu is not False, here=False)
        return cls(jetson=False, gpu=bool(gpu), here=False)

    def has_gpu(self) -> bool:
        return gpu_present() if self.gpu is None else self.gpu

    def named_device(self, backend: str) -> str:
        """Where a named backend runs when the model's device is auto: TensorRT on the GPU,
        torch on the GPU when there is one (here: when torch has CUDA), ONNX Runtime on the
        CPU (pip's onnxruntime is CPU-only) unless here it has the CUDA provider."""
        here = self.here and self.gpu is None
        if backend == "tensorrt":
            return "cuda"
        if backend == "torch":
            return "cuda" if (torch_cuda_available() if here else self.has_gpu()) else "cpu"
        if here and backend == "onnxruntime" and available()["onnxruntime"] is None:
            providers = import_onnxruntime().get_available_providers()
            return "cuda" if "CUDAExecutionProvider" in providers else "cpu"
        return "cpu"


def model_spec(mc: ModelConfig) -> ModelSpec:
    try:
        return ModelSpec(checkpoint=mc.checkpoint, layout=mc.layout, persons=mc.persons,
                         frames=mc.frames, motion=mc.motion, labels=tuple(mc.labels))
    except ValueError as exc:
        raise UserError(f"model {mc.name!r}: {exc}") from None


def resolve_max_batch(mc: ModelConfig, device: str, target: Target) -> int:
    """max_batch 0 (auto): the largest default bucket on a GPU, where batching multiplies
    throughput; 8 on a Jetson, whose GPU is done multiplying long before; 16 on a CPU, where
    it only saves per-call overhead."""
    if mc.max_batch:
        return mc.max_batch
    gpu = device.startswith("cuda") or (mc.backend in ("auto", "torch", "tensorrt")
                                        and mc.device == "auto" and target.has_gpu())
    if gpu and target.jetson:
        return JETSON_MAX_BATCH  # an Orin NX takes tens of ms for a batch of 8 M=5 windows
    return AUTO_MAX_BATCH_GPU if gpu else AUTO_MAX_BATCH_CPU


def serving_plan(mc: ModelConfig, target: Target | None = None
                 ) -> tuple[ModelSpec, BuildOptions]:
    """The spec and options `serve` loads `mc` with on `target` (default: this machine): the
    one translation of a model's configuration, used by `serve`, `build --config` and any
    tool that takes a [[models]] entry.

    For backend auto the options' device is cpu: the auto chain (provision.auto_chain) picks
    the device along with the runtime."""
    target = target or Target.this_machine()
    device = (mc.device if mc.device != "auto" else
              "cpu" if mc.backend == "auto" else target.named_device(mc.backend))
    max_batch = resolve_max_batch(mc, device, target)
    options = BuildOptions(precision=mc.precision, max_batch=max_batch, device=device,
                           dynamic_batch=max_batch > 1, calibration=mc.calibration,
                           allow_synthetic_calibration=mc.allow_synthetic_calibration,
                           # On CUDA only (the runtimes' rule); auto's device is not known yet.
                           cuda_graph=mc.cuda_graph, threads=mc.threads,
                           compile=mc.compile, instances=mc.instances, buckets=mc.buckets,
                           workspace_mb=JETSON_WORKSPACE_MB if target.jetson else WORKSPACE_MB)
    if mc.backend != "auto":
        options = named_options(mc.backend, options)
    return model_spec(mc), options
