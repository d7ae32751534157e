"""The simulated board's facts and failures (see sitecustomize.py); `board_env` for tests."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.machinery
import json
import os
import signal
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
GB = 1 << 30
MB = 1 << 20
# An Orin NX 8 GB as it reports itself: JetPack 5.1.2 = L4T R35.4.1, JetPack 6.0 = R36.3.0.
RELEASES = {
    "5.1.2": ("# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: "
              "aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n"),
    "6.0": ("# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, "
            "DATE: Mon May  6 17:34:21 UTC 2024\n"),
}
TEGRA_RELEASE = RELEASES["5.1.2"]
MODEL = "NVIDIA Orin NX Developer Kit\x00"
TOTAL_KB = 7630072
ORIN = {"name": "Orin", "compute_capability": "8.7"}
FAILURES = ("build", "load", "context")

# The board's memory, simulated (MB; estimates, not measured on a board): the OS and its
# services; the cameras' processes; the page cache (warm: a board that has run a while);
# what a TensorRT build pulls into the cache (libnvinfer, cuDNN: 1-2 GB); what the first
# runner of a process pays once for its libraries' kernel images and handles (CUDA 11.4 on
# JetPack 5 loads every module eagerly; JetPack 6's CUDA 12.2 loads them lazily); an engine.
OS_MB = 900
EAGER_MB = {"5.1.2": 700, "6.0": 150}
BUILD_CACHE_MB = 1500
ENGINE_MB = 20
ROW_MB_PER_PERSON = 8    # a runner's activations: 8 MB per person per batch row (estimate)
MIN_FREE_MB = 100        # the kernel evicts page cache rather than go below this


def write_root(root: Path, jetpack: str = "5.1.2") -> Path:
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc" / "nv_tegra_release").write_text(RELEASES[jetpack])
    (root / "proc" / "device-tree").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "device-tree" / "model").write_text(MODEL)
    return root


class Memory:
    """The board's unified memory, shared by the daemon and its build child through a state
    file under the simulated root; /proc/meminfo is rewritten at every change. What a
    process took is given back when it is gone (`used` is kept per pid)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / "sim-memory.json"

    def state(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # The daemon's threads and its build child change it: one at a time, and a reader
        # never sees half a file (written aside, then renamed).
        with open(self.root / "sim-memory.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def set(self, **values: Any) -> dict[str, Any]:
        with self._locked():
            return self._set(**values)

    def _set(self, **values: Any) -> dict[str, Any]:
        state = {"used": {}, **(self.state() if self.path.exists() else {}), **values}
        state["used"] = {pid: mb for pid, mb in state["used"].items() if _alive(int(pid))}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path)
        self._write_meminfo(state)
        return state

    def add(self, **deltas: float) -> dict[str, Any]:
        with self._locked():
            state = self.state()
            return self._set(**{k: state.get(k, 0) + v for k, v in deltas.items()})

    def free_mb(self, state: dict[str, Any] | None = None) -> float:
        st = state or self.state()
        return (TOTAL_KB / 1024 - OS_MB - st["cameras"] - st["cache"]
                - sum(st.get("used", {}).values()))

    def available_mb(self) -> float:
        st = self.state()
        return self.free_mb(st) + st["cache"]

    def grow_cache(self, mb: float) -> None:
        """Reading files fills the cache up to what is free; older cache is evicted."""
        with self._locked():
            state = self.state()
            self._set(cache=state["cache"] + max(min(mb, self.free_mb(state) - MIN_FREE_MB), 0))

    def take(self, mb: float) -> None:
        """This process allocates (the GPU's memory is the board's): page cache is reclaimed
        when MemFree runs short, as the kernel does."""
        with self._locked():
            state = self.state()
            short = mb - (self.free_mb(state) - MIN_FREE_MB)
            used = dict(state.get("used", {}))
            used[str(os.getpid())] = used.get(str(os.getpid()), 0) + mb
            self._set(used=used, cache=state["cache"] - min(max(short, 0), state["cache"]))

    def take_for_cameras(self, mb: float) -> None:
        """The cameras' processes grow after the daemon started (reclaiming cache first)."""
        with self._locked():
            state = self.state()
            short = mb - (self.free_mb(state) - MIN_FREE_MB)
            self._set(cameras=state["cameras"] + mb,
                      cache=state["cache"] - min(max(short, 0), state["cache"]))

    def give_back(self, mb: float) -> None:
        self.take(-mb)

    def _write_meminfo(self, st: dict[str, Any]) -> None:
        free = int(self.free_mb(st) * 1024)
        available = free + int(st["cache"] * 1024)
        (self.root / "proc").mkdir(parents=True, exist_ok=True)
        tmp = self.root / "proc" / f".meminfo.{os.getpid()}"
        tmp.write_text(
            f"MemTotal:       {TOTAL_KB} kB\nMemFree:        {free} kB\n"
            f"MemAvailable:   {available} kB\nCached:         {int(st['cache'] * 1024)} kB\n"
            "SwapTotal:             0 kB\nSwapFree:              0 kB\n")
        os.replace(tmp, self.root / "proc" / "meminfo")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def board_env(tmp: Path, fail_at: str | None = None, jetpack: str = "5.1.2",
              cameras_gb: float = 0.5, cache_gb: float = 0.0, oom_builds: int = 0
              ) -> dict[str, str]:
    """os.environ for a daemon on the simulated board: TensorRT fails at `fail_at` (None:
    it works), the cameras hold `cameras_gb`, the page cache `cache_gb`, and the first
    `oom_builds` TensorRT builds are killed by the out-of-memory killer (SIGKILL)."""
    assert fail_at is None or fail_at in FAILURES, fail_at
    root = write_root(tmp / "board-root", jetpack)
    memory = Memory(root)
    if not memory.path.exists():  # a second daemon on the same board keeps its state
        memory.set(cameras=cameras_gb * 1024, cache=cache_gb * 1024, oom_builds=oom_builds)
    spec = {"root": str(root), "fail_at": fail_at, "eager_mb": EAGER_MB[jetpack]}
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

    root = Path(spec["root"])
    memory = Memory(root)
    memory.set()  # what processes gone since took is free again
    stgcnd.board.ROOT = root
    sys.modules["tensorrt"] = _fake_tensorrt()

    import stgcnd.engines.build as store_build
    import stgcnd.engines.builders.tensorrt as builder
    import stgcnd.engines.device as device
    import stgcnd.runtimes as runtimes
    import stgcnd.runtimes.cuda as cuda
    import stgcnd.runtimes.tensorrt_runtime as trt_runtime
    from stgcnd.runtimes.base import RuntimeInfo
    from stgcnd.runtimes.noop import NoopRunner

    def orin() -> dict[str, str]:
        return dict(ORIN)

    def mem_get_info() -> tuple[int, int]:
        # What cuMemGetInfo says on a Jetson: MemFree, without the reclaimable page cache.
        return int(memory.free_mb() * MB), TOTAL_KB * 1024

    for module in (cuda, runtimes, device):
        module.device_properties = orin  # type: ignore[attr-defined]
    cuda.memory_info = mem_get_info  # type: ignore[attr-defined]
    cuda.integrated = lambda: True  # type: ignore[attr-defined]
    fail_at = spec["fail_at"]
    paid = []  # the first runner of this process pays the libraries' fixed part once

    def check(self: Any, options: Any) -> None:
        pass

    def build(self: Any, ctx: Any, out: Path) -> dict[str, Any]:
        memory.grow_cache(BUILD_CACHE_MB)  # libnvinfer, cuDNN, the timing cache
        if memory.state().get("oom_builds", 0) > 0:
            memory.add(oom_builds=-1)
            os.kill(os.getpid(), signal.SIGKILL)  # the out-of-memory killer
        if fail_at == "build":
            raise RuntimeError("TensorRT returned no engine: [TRT] Requested amount of GPU "
                               "memory (1073741824 bytes) could not be allocated (simulated "
                               "Orin NX out of memory)")
        out.write_bytes(b"simulated engine")
        return {"tensorrt": "8.5.2.2", "simulated": True}

    validate = store_build.validate_artifact

    def no_validation(builder: Any, ctx: Any, draft: Any) -> Any:
        if builder.name != "tensorrt":
            return validate(builder, ctx, draft)
        return {"skipped": "simulated board: the engine cannot be run to validate it"}

    def load(self: Any, engine_path: Path, input_shape: tuple[int, ...], num_class: int,
             max_batch: int = 1, precision: str = "fp32", cuda_graph: bool = False) -> None:
        if fail_at == "load":
            raise RuntimeError("simulated: deserialize_cuda_engine returned None "
                               "(std::bad_alloc)")
        self.info = RuntimeInfo("tensorrt", precision, "cuda:0", tuple(input_shape),
                                int(num_class), int(max_batch), str(engine_path))
        self.compute_us = 0
        self.sim_loaded = True
        memory.take(ENGINE_MB)

    def runner_bytes(self: Any, buckets: Any) -> int:
        # TensorRT's own figure (device_memory_size): exact for the activations.
        return ROW_MB_PER_PERSON * MB * int(self.info.input_shape[-1]) * max(buckets)

    class SimRunner(NoopRunner):
        def __init__(self, runtime: Any, buckets: Any, lanes: int) -> None:
            super().__init__(runtime, buckets, lanes)
            if not paid:
                paid.append(True)
                memory.take(spec["eager_mb"])  # kernel images, cuDNN/cuBLAS handles
            self.took = runner_bytes(runtime, buckets) / MB + 2  # + its lanes' streams
            memory.take(self.took)

        def close(self) -> None:
            memory.give_back(self.took)
            self.took = 0

    def open_runner(self: Any, buckets: Any, lanes: int) -> Any:
        if fail_at == "context":
            raise RuntimeError("simulated: TensorRT could not create an execution context "
                               "(out of memory)")
        return SimRunner(self, buckets, lanes)

    def close(self: Any) -> None:
        if getattr(self, "sim_loaded", False):
            memory.give_back(ENGINE_MB)
            self.sim_loaded = False

    builder.TensorRTBuilder.check = check  # type: ignore[method-assign]
    builder.TensorRTBuilder.build = build  # type: ignore[method-assign]
    store_build.validate_artifact = no_validation
    trt_runtime.TensorRTRuntime.__init__ = load  # type: ignore[method-assign]
    trt_runtime.TensorRTRuntime._open_runner = open_runner  # type: ignore[method-assign]
    trt_runtime.TensorRTRuntime.runner_bytes = runner_bytes  # type: ignore[method-assign]
    trt_runtime.TensorRTRuntime.close = close  # type: ignore[method-assign]
