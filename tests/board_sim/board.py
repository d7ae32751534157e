"""The simulated board's facts and failures (see sitecustomize.py); `board_env` for tests."""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
GB = 1 << 30
# An Orin NX 8 GB as it reports itself (JetPack 5.1.2 = L4T R35.4.1).
TEGRA_RELEASE = ("# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: "
                 "aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n")
MODEL = "NVIDIA Orin NX Developer Kit\x00"
MEMINFO = "MemTotal:        7630072 kB\nMemFree:          412760 kB\n"
ORIN = {"name": "Orin", "compute_capability": "8.7"}
FAILURES = ("build", "load", "context")


def write_root(root: Path) -> Path:
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "nv_tegra_release").write_text(TEGRA_RELEASE)
    (root / "proc" / "device-tree").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "device-tree" / "model").write_text(MODEL)
    (root / "proc" / "meminfo").write_text(MEMINFO)
    return root


def board_env(tmp: Path, fail_at: str, free_gb: float = 5.5) -> dict[str, str]:
    """os.environ for a daemon on the simulated board: TensorRT fails at `fail_at`."""
    assert fail_at in FAILURES, fail_at
    spec = {"root": str(write_root(tmp / "board-root")), "fail_at": fail_at,
            "free": int(free_gb * GB), "total": int(7.3 * GB)}
    paths = [str(HERE), str(REPO / "daemon"), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "BOARD_SIM": json.dumps(spec),
            "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def no_torch_env() -> dict[str, str]:
    """os.environ for a daemon (and the build processes it spawns) without torch."""
    paths = [str(HERE), str(REPO / "daemon"), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "SIM_NO_TORCH": "1",
            "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _fake_tensorrt() -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    trt.__version__ = "8.5.2.2"
    trt.BuilderFlag = types.SimpleNamespace(FP16=0, INT8=1)
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(EXPLICIT_BATCH=0)
    return trt


def install(spec: dict[str, Any]) -> None:
    import stgcnd.board

    stgcnd.board.ROOT = Path(spec["root"])
    sys.modules["tensorrt"] = _fake_tensorrt()

    import stgcnd.engines.builders.tensorrt as builder
    import stgcnd.engines.device as device
    import stgcnd.runtimes as runtimes
    import stgcnd.runtimes.cuda as cuda
    import stgcnd.runtimes.tensorrt_runtime as trt_runtime
    import stgcnd.server.models as models
    from stgcnd.errors import BackendUnavailable
    from stgcnd.runtimes.base import RuntimeInfo

    def orin() -> dict[str, str]:
        return dict(ORIN)

    def memory() -> tuple[int, int]:
        return int(spec["free"]), int(spec["total"])

    for module in (cuda, runtimes, device):
        module.device_properties = orin  # type: ignore[attr-defined]
    for module in (cuda, models):
        module.memory_info = memory  # type: ignore[attr-defined]
    fail_at = spec["fail_at"]

    def check(self: Any, options: Any) -> None:
        pass

    def build(self: Any, ctx: Any, out: Path) -> dict[str, Any]:
        if fail_at == "build":
            raise RuntimeError("TensorRT returned no engine: [TRT] Requested amount of GPU "
                               "memory (1073741824 bytes) could not be allocated (simulated "
                               "Orin NX out of memory)")
        out.write_bytes(b"simulated engine")
        return {"tensorrt": "8.5.2.2", "simulated": True}

    def no_validation(self: Any, ctx: Any, artifact: Any) -> Any:
        raise BackendUnavailable("simulated board: the engine cannot be run to validate it")

    def load(self: Any, engine_path: Path, input_shape: tuple[int, ...], num_class: int,
             max_batch: int = 1, precision: str = "fp32", cuda_graph: bool = False) -> None:
        if fail_at == "load":
            raise RuntimeError("simulated: deserialize_cuda_engine returned None "
                               "(std::bad_alloc)")
        self.info = RuntimeInfo("tensorrt", precision, "cuda:0", tuple(input_shape),
                                int(num_class), int(max_batch), str(engine_path))

    def no_context(self: Any, buckets: Any, lanes: int) -> Any:
        raise RuntimeError("simulated: TensorRT could not create an execution context "
                           "(out of memory)")

    builder.TensorRTBuilder.check = check  # type: ignore[method-assign]
    builder.TensorRTBuilder.build = build  # type: ignore[method-assign]
    builder.TensorRTBuilder.open_for_validation = no_validation  # type: ignore[method-assign]
    trt_runtime.TensorRTRuntime.__init__ = load  # type: ignore[method-assign]
    trt_runtime.TensorRTRuntime._open_runner = no_context  # type: ignore[method-assign]
    trt_runtime.TensorRTRuntime.runner_bytes = (  # type: ignore[method-assign]
        lambda self, buckets: 64 * (1 << 20) * max(buckets))
    trt_runtime.TensorRTRuntime.close = lambda self: None  # type: ignore[method-assign]
