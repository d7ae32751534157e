"""The simulated board's facts and failures (see sitecustomize.py); `board_env` for tests."""

from __future__ import annotations

import contextlib
import enum
import fcntl
import importlib.machinery
import json
import multiprocessing
import os
import signal
import sys
import time
import types
from collections.abc import Iterable, Iterator
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
# TensorRT as each JetPack ships it: 5.1.2 -> 8.5.2 (CUDA 11.4), 6.0 -> 8.6.2 (CUDA 12.2).
TENSORRT = {"5.1.2": "8.5.2.2", "6.0": "8.6.2.3"}
# What a process pays when TensorRT initialises an external tactic library: the GPU figures
# TensorRT logs ("[MemUsageChange] Init cuBLAS/cuBLASLt: ... GPU +182", "Init cuDNN: ... GPU
# +241") loading an engine with trtexec in NVIDIA/TensorRT#2217 (CUDA 11.4, no lazy loading).
# On an integrated GPU the driver's free memory is the board's, so the host side is inside
# them. JetPack 6 (lazy loading) is given the same figures: none measured there. A build
# process pays them when its config enables those sources, a serving process when it loads an
# engine built with them.
LIBRARY_MB = {"CUBLAS": 182, "CUDNN": 241}  # CUBLAS_LT comes with cuBLAS (one init line)
# The build process's own memory beyond its kernel images (EAGER_MB) and the workspace limit:
# the parsed network, tactic timing buffers, the engine being serialized, libnvinfer's host
# side. An estimate, not measured on a board.
BUILDER_MB = 800
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
              cameras_gb: float = 0.5, cache_gb: float = 0.0, oom_builds: int = 0,
              slow_build_s: float | None = None, hold_build: Path | None = None,
              contexts_up_to: int | None = None, big_contexts_s: float = 0.0
              ) -> dict[str, str]:
    """os.environ for a daemon on the simulated board: TensorRT fails at `fail_at` (None:
    it works), the cameras hold `cameras_gb`, the page cache `cache_gb`, and the first
    `oom_builds` TensorRT builds are killed by the out-of-memory killer (SIGKILL).

    `slow_build_s` (TensorRT succeeding slowly, #45): a build takes that long (after
    `hold_build` exists, when given), and its engine computes for real: ONNX Runtime on the
    CPU runs the ONNX it was built from, so it is validated against the fp32 reference as on
    a board and its outputs are right. Without it an engine answers zeros (NoopRunner).
    `contexts_up_to`: a serving runner whose largest bucket is larger fails (out of
    memory; the build child's validation makes its runners), or with `big_contexts_s` takes
    that long to make."""
    assert fail_at is None or fail_at in FAILURES, fail_at
    root = write_root(tmp / "board-root", jetpack)
    memory = Memory(root)
    if not memory.path.exists():  # a second daemon on the same board keeps its state
        memory.set(cameras=cameras_gb * 1024, cache=cache_gb * 1024, oom_builds=oom_builds)
    spec = {"root": str(root), "fail_at": fail_at, "eager_mb": EAGER_MB[jetpack],
            "tensorrt": TENSORRT[jetpack], "slow_build_s": slow_build_s,
            "hold_build": str(hold_build) if hold_build else None,
            "contexts_up_to": contexts_up_to, "big_contexts_s": big_contexts_s}
    paths = [str(HERE), str(REPO / "daemon"), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "BOARD_SIM": json.dumps(spec),
            "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def no_torch_env() -> dict[str, str]:
    """os.environ for a daemon (and the build processes it spawns) without torch."""
    paths = [str(HERE), str(REPO / "daemon"), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "SIM_NO_TORCH": "1",
            "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


class TacticSource(enum.IntEnum):  # 8.5 and 8.6's members (api-8.6.1.txt)
    CUBLAS = 0
    CUBLAS_LT = 1
    CUDNN = 2
    EDGE_MASK_CONVOLUTIONS = 3
    JIT_CONVOLUTIONS = 4


class Severity(enum.IntEnum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


def _fake_tensorrt(version: str, build: Any) -> types.ModuleType:
    """A TensorRT 8.5/8.6 module with just the builder surface stgcnd's real build() uses;
    `build(config)` is what building costs on the board (the engine's bytes, or a kill)."""
    trt = types.ModuleType("tensorrt")
    trt.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    trt.__version__ = version
    trt.BuilderFlag = types.SimpleNamespace(FP16=0, INT8=1)
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(EXPLICIT_BATCH=0)
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE=0)
    trt.TacticSource = TacticSource

    class ILogger:
        def __init__(self) -> None:
            pass

    ILogger.Severity = Severity  # type: ignore[attr-defined]

    class Config:
        def __init__(self) -> None:
            # 8.5 and 8.6 enable cuBLAS, cuBLASLt and cuDNN by default.
            self.tactic_sources = sum(1 << int(m) for m in TacticSource)
            self.workspace = 0

        def set_memory_pool_limit(self, pool: int, size: int) -> None:
            self.workspace = size

        def set_flag(self, flag: int) -> None:
            pass

        def get_tactic_sources(self) -> int:
            return self.tactic_sources

        def set_tactic_sources(self, sources: int) -> bool:
            self.tactic_sources = int(sources)
            return True

        def add_optimization_profile(self, profile: Any) -> int:
            return 0

    if not version.startswith("8.5"):  # the builder optimization level arrived in 8.6
        Config.builder_optimization_level = 3  # type: ignore[attr-defined]

    class Network:
        onnx = ""  # the file the parser read (a slowly succeeding engine runs it)

        def get_input(self, i: int) -> Any:
            return types.SimpleNamespace(name="input", shape=(-1, 3, 24, 33, 1))

    class Builder:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        def create_network(self, flags: int) -> Network:
            return Network()

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Any:
            return types.SimpleNamespace(set_shape=lambda *shapes: None)

        def build_serialized_network(self, network: Network, config: Config) -> bytes:
            return build(config, self.logger, network.onnx)  # type: ignore[no-any-return]

    class OnnxParser:
        def __init__(self, network: Any, logger: Any) -> None:
            self.network = network

        def parse_from_file(self, path: str) -> bool:
            self.network.onnx = path
            return True

    trt.ILogger = ILogger
    trt.IBuilderConfig = Config
    trt.Builder = Builder
    trt.OnnxParser = OnnxParser
    return trt


def libraries_mb(sources: Iterable[str]) -> int:
    """What initialising the external tactic libraries among `sources` costs a process."""
    return sum(mb for name, mb in LIBRARY_MB.items() if name in set(sources))


def slow_build(spec: dict[str, Any]) -> None:
    """A slowly succeeding build (`slow_build_s`): held until its file exists, then slow."""
    if spec.get("slow_build_s") is None:
        return
    hold = spec.get("hold_build")
    while hold and not Path(hold).exists():
        time.sleep(0.1)
    time.sleep(float(spec["slow_build_s"]))


def install(spec: dict[str, Any]) -> None:
    import stgcnd.board

    root = Path(spec["root"])
    memory = Memory(root)
    memory.set()  # what processes gone since took is free again
    stgcnd.board.ROOT = root
    version = spec["tensorrt"]
    fail_at = spec["fail_at"]

    def build(config: Any, logger: Any, onnx: str) -> bytes | None:
        """The build process on the board: the libraries' files fill the page cache; its
        kernel images, the workspace, the builder's own memory and the external tactic
        libraries its config enables are taken; the out-of-memory killer ends it when the
        board cannot give that (or when told to: `oom_builds`)."""
        memory.grow_cache(BUILD_CACHE_MB)  # libnvinfer, cuDNN, the timing cache
        sources = [m.name for m in TacticSource if config.tactic_sources & (1 << int(m))]
        need = spec["eager_mb"] + config.workspace / MB + BUILDER_MB + libraries_mb(sources)
        state = memory.state()
        told = state.get("oom_builds", 0) > 0
        if told or need > memory.free_mb(state) + state["cache"] - MIN_FREE_MB:
            if told:
                memory.add(oom_builds=-1)
            os.kill(os.getpid(), signal.SIGKILL)  # the out-of-memory killer
        memory.take(need)  # the peak; given back as the build ends (the parent measures
        slow_build(spec)   # (held at its peak while it runs)
        memory.give_back(need)  # the model from then on: a dead child's share is not its)
        if fail_at == "build":  # as TensorRT fails: errors logged, then no engine
            logger.log(Severity.ERROR, "Requested amount of GPU memory (1073741824 bytes) "
                       "could not be allocated (simulated Orin NX out of memory)")
            logger.log(Severity.ERROR, "[builderUtils.cpp::makeEngineFromGraph::1515] Error "
                       "Code 2: Internal Error (simulated)")
            return None
        return json.dumps({"simulated": True, "tensorrt": version,
                           "tactic_sources": sources, "onnx": onnx}).encode()

    sys.modules["tensorrt"] = _fake_tensorrt(version, build)

    import stgcnd.engines.build as store_build
    import stgcnd.engines.builders.tensorrt as builder
    import stgcnd.engines.device as device
    import stgcnd.runtimes as runtimes
    import stgcnd.runtimes.cuda as cuda
    import stgcnd.runtimes.tensorrt_runtime as trt_runtime
    from stgcnd.runtimes.base import HostRunner, RuntimeInfo
    from stgcnd.runtimes.noop import NoopRunner
    from stgcnd.runtimes.onnxruntime_runtime import ort_session

    runs = spec.get("slow_build_s") is not None

    def orin() -> dict[str, str]:
        return dict(ORIN)

    def mem_get_info() -> tuple[int, int]:
        # What cuMemGetInfo says on a Jetson: MemFree, without the reclaimable page cache.
        return int(memory.free_mb() * MB), TOTAL_KB * 1024

    for module in (cuda, runtimes, device):
        module.device_properties = orin  # type: ignore[attr-defined]
    cuda.memory_info = mem_get_info  # type: ignore[attr-defined]
    cuda.integrated = lambda: True  # type: ignore[attr-defined]
    paid = []  # the first runner of this process pays the libraries' fixed part once
    libraries: set[str] = set()  # the tactic libraries this process initialised

    def check(self: Any, options: Any) -> None:
        pass

    validate = store_build.validate_artifact

    def no_validation(builder: Any, ctx: Any, draft: Any) -> Any:
        if builder.name != "tensorrt":
            return validate(builder, ctx, draft)
        if runs:  # an engine that computes is validated, in the build child
            try:
                return validate(builder, ctx, draft)
            finally:  # what it paid goes back as the child ends, before the daemon measures
                memory.give_back(spec["eager_mb"] * len(paid) + libraries_mb(libraries))
                paid.clear()
                libraries.clear()
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
        self.sim_session = ort_session(Path(json.loads(Path(engine_path).read_bytes())[
            "onnx"]), "cpu", 1) if runs else None
        # Deserializing initialises the tactic libraries the engine was built with, once per
        # process (the "[MemUsageChange] Init cuBLAS/cuDNN" lines of NVIDIA/TensorRT#2217).
        built_with = json.loads(Path(engine_path).read_bytes())["tactic_sources"]
        new = set(built_with) & set(LIBRARY_MB) - libraries
        libraries.update(new)
        memory.take(libraries_mb(new))

    def runner_bytes(self: Any, buckets: Any) -> int:
        # TensorRT's own figure (device_memory_size): exact for the activations.
        return ROW_MB_PER_PERSON * MB * int(self.info.input_shape[-1]) * max(buckets)

    class SimRunner(NoopRunner):
        def __init__(self, runtime: Any, buckets: Any, lanes: int) -> None:
            super().__init__(runtime, buckets, lanes)
            self.take(runtime, buckets)

        def take(self, runtime: Any, buckets: Any) -> None:
            if not paid:
                paid.append(True)
                memory.take(spec["eager_mb"])  # kernel images, cuDNN/cuBLAS handles
            self.took = runner_bytes(runtime, buckets) / MB + 2  # + its lanes' streams
            memory.take(self.took)

        def close(self) -> None:
            memory.give_back(self.took)
            self.took = 0

    class SimComputingRunner(HostRunner):
        """An engine that computes: the ONNX it was built from, on ONNX Runtime (CPU)."""

        def __init__(self, runtime: Any, buckets: Any, lanes: int) -> None:
            super().__init__(runtime.info, self._run, buckets, lanes)
            self.session = runtime.sim_session
            self.took = 0.0
            SimRunner.take(self, runtime, buckets)

        def _run(self, batch: Any) -> Any:
            t0 = time.perf_counter()
            out = self.session.run(None, {self.session.get_inputs()[0].name: batch})[0]
            return out, (time.perf_counter() - t0) * 1e3

        def close(self) -> None:
            memory.give_back(self.took)
            self.took = 0

    def open_runner(self: Any, buckets: Any, lanes: int) -> Any:
        serving = multiprocessing.current_process().name != "stgcnd-build"  # not validating
        big = serving and max(buckets) > (spec.get("contexts_up_to") or 1 << 30)
        if big and spec.get("big_contexts_s"):
            time.sleep(spec["big_contexts_s"])
        elif fail_at == "context" or big:
            raise RuntimeError("simulated: TensorRT could not create an execution context "
                               "(out of memory)")
        if getattr(self, "sim_session", None) is not None:
            return SimComputingRunner(self, buckets, lanes)
        return SimRunner(self, buckets, lanes)

    def close(self: Any) -> None:
        if getattr(self, "sim_loaded", False):
            memory.give_back(ENGINE_MB)
            self.sim_loaded = False

    builder.TensorRTBuilder.check = check  # type: ignore[method-assign]
    store_build.validate_artifact = no_validation
    trt_runtime.TensorRTRuntime.__init__ = load  # type: ignore[method-assign]
    trt_runtime.TensorRTRuntime._open_runner = open_runner  # type: ignore[method-assign]
    trt_runtime.TensorRTRuntime.runner_bytes = runner_bytes  # type: ignore[method-assign]
    trt_runtime.TensorRTRuntime.close = close  # type: ignore[method-assign]
