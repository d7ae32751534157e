"""PyTorch: the inference-optimized network (BatchNorm folded, channels-last) on CPU or CUDA.

On a CPU a runner computes on a worker thread (`HostRunner`); on CUDA it replays one CUDA
graph per bucket (`CudaGraphRunner`), eager on its worker where no graph can be captured.
fp16 is CUDA-only (never silently bf16 on a CPU; bf16 is offered explicitly there).
`optimized=False` is the plain network with the seeds' host I/O: the eager baseline.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Callable, Tuple

import numpy as np
import torch

from stgcnd.errors import BackendUnavailable
from stgcnd.log import get_logger
from stgcnd.model.loader import LoadedModel
from stgcnd.model.optimized import Form, FusedTwoStream, optimize
from stgcnd.model.stgcn import MotionFormula, motion
from stgcnd.runtimes import cpu_bf16, torch_compile
from stgcnd.runtimes.base import HostRunner, Runner, Runtime, RuntimeInfo
from stgcnd.runtimes.cuda import first_failure
from stgcnd.runtimes.cuda_batch import CAPTURE_LOCK, GraphsUnavailable, LanedBatch

log = get_logger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16")
Run = Callable[[torch.Tensor], torch.Tensor]
Runs = Tuple[Run, Tuple[Run, ...]]  # the whole module; its two streams where they run apart
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# How a graph capture treats other threads' CUDA calls. torch 2.1+ captures "thread_local":
# only the capturing thread is restricted. torch 2.0 (JetPack 5's NVIDIA wheel) takes no mode
# and captures in CUDA's "global" mode, where a potentially unsafe call from any other thread
# fails (and spoils the capture): there a serving runner makes no CUDA call at all while
# another thread captures (CudaGraphRunner). Passing the keyword to torch 2.0 raised TypeError.
_TAKES_CAPTURE_MODE = "capture_error_mode" in inspect.signature(
    torch.cuda.graph.__init__).parameters
CAPTURE_MODE = "thread_local" if _TAKES_CAPTURE_MODE else "global"


def _graph_capture(graph: torch.cuda.CUDAGraph, pool: torch.cuda._POOL_HANDLE,
                   stream: torch.cuda.Stream) -> AbstractContextManager[object]:
    if _TAKES_CAPTURE_MODE:
        return torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=CAPTURE_MODE)
    return torch.cuda.graph(graph, pool=pool, stream=stream)


def cuda_device() -> torch.device:
    if not torch.cuda.is_available():
        raise BackendUnavailable("CUDA is not available to torch; use device = \"cpu\", or "
                                 "install a CUDA build of torch and check the driver")
    torch.cuda.init()
    return torch.device("cuda", torch.cuda.current_device())


class TorchRuntime(Runtime):
    def __init__(self, model: LoadedModel, precision: str = "fp32", device: str = "cpu",
                 cuda_graph: bool = False, max_batch: int = 64, optimized: bool = True,
                 threads: int = 0, form: Form = "channels_last", compile_mode: str = "off",
                 compile_cache: Path | None = None,
                 tuned_batches: frozenset[int] | None = None,
                 dynamic_kernels: bool = False) -> None:
        if precision not in PRECISIONS:
            raise BackendUnavailable(f"the torch runtime runs fp32, fp16 (CUDA) or bf16 (CPU), "
                                     f"not {precision!r}; use tensorrt or onnxruntime for int8")
        self.device = torch.device(device)
        if self.device.type == "cpu" and precision == "fp16":
            raise BackendUnavailable("fp16 needs CUDA with the torch runtime; on the CPU use "
                                     "fp32, or bf16 explicitly on a CPU with AMX/AVX512-BF16 "
                                     "(faster, less exact)")
        if self.device.type == "cuda" and precision == "bf16":
            raise BackendUnavailable("use fp16 on CUDA (bf16 is offered for CPUs only)")
        if self.device.type == "cuda":
            self.device = cuda_device() if self.device.index is None else self.device
            # Fixed shapes: let cuDNN pick the fastest kernels once. fp32 must stay fp32 (TF32
            # convolutions differ from the CPU reference by ~1e-3, beyond the 1e-4 contract).
            torch.backends.cudnn.benchmark = True
            if precision == "fp32":
                torch.backends.cudnn.allow_tf32 = False
                torch.backends.cuda.matmul.allow_tf32 = False
        elif threads > 0:
            torch.set_num_threads(threads)
        if self.device.type == "cpu" and precision == "bf16" and cpu_bf16() is None:
            log.warning("bf16_emulated", reason="this CPU has no bf16 instructions (AVX512-BF16, "
                        "AMX or Arm BF16): bf16 runs emulated, slower than fp32",
                        fix='use precision = "fp32"')
        self.dtype = _DTYPES[precision]
        self._window_cost: tuple[int, int] | None = None  # (fixed, per window) bytes
        self.optimized = optimized
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        if optimized:
            module = optimize(model.module, form)
        elif self.device.type == "cpu" and precision == "fp32":
            module = model.module  # shared, unchanged: the reference network itself
        else:
            module = copy.deepcopy(model.module)  # never move the caller's network
        self.module = module.to(self.device, self.dtype).eval()
        for p in self.module.parameters():
            p.requires_grad_(False)
        # The two streams of a two-stream model are independent until their logits are
        # summed: on CUDA the motion stream runs on a second CUDA stream, so that (inside a
        # graph, as two parallel branches) their small kernels overlap.
        self.parallel_streams = (optimized and self.device.type == "cuda"
                                 and isinstance(self.module, FusedTwoStream))
        self.compile_mode = "off"
        self._compiled: set[int] = set()  # batch sizes compiled (each logs once)
        self.compile_failed = False
        # With max-autotune: the batch sizes whose autotuned kernels passed their trial
        # (engines/builders/torch_autotune.py); the others run inductor's default kernels.
        # None: every batch size autotuned (the trial itself).
        self.tuned_batches = tuned_batches
        # Compiled kernels dynamic in the batch (torch_compile.compiled): what serves at once
        # while the buckets are tuned (server/serve_now.py), a few compiles instead of ten.
        self.dynamic_kernels = dynamic_kernels
        self._runs: Runs = (self.module, ())
        self._tuned_runs: Runs = self._runs
        self._runs_mode = "off"           # what _runs were compiled with
        self._tuned: frozenset[int] = frozenset()  # the batch sizes that run _tuned_runs
        self._formula: MotionFormula = getattr(model.module, "motion_formula",
                                               "first-difference")
        self._use_compile("off")
        if optimized:
            mode, why_not = torch_compile.resolve(compile_mode, self.device)
            if why_not is not None and compile_mode != "auto":
                log.warning("torch_compile_unavailable", asked=compile_mode, reason=why_not,
                            action="serving the uncompiled module")
            try:  # an unusable cache fails as early as dynamo's import
                if mode != "off" and compile_cache is not None:
                    torch_compile.use_cache(compile_cache, self.device)
                self._use_compile(mode)
            except Exception as exc:
                self._compile_failed(exc, mode)
        variant = (("optimized" if optimized else "eager")
                   + (f"+compile({self.compile_mode})" if self.compile_mode != "off" else "")
                   + ("+dynamic-batch" if self.dynamic_kernels and self.compile_mode != "off"
                      and torch_compile.marks_dynamic() else "")
                   + ("+cudagraph" if self.cuda_graph else ""))
        self.classes = int(model.num_class)  # the checkpoint's classifier (model.info)
        self.info = RuntimeInfo(
            name="torch", precision=precision, device=str(self.device),
            input_shape=tuple(model.spec.input_shape), num_class=int(model.num_class),
            max_batch=int(max_batch), artifact=None,
            details={"variant": variant, "torch": torch.__version__,
                     "compile": "off (failed)" if self.compile_failed else self.compile_mode,
                     "graph_op": model.spec.graph_op, **({"form": form} if optimized else {})})
        log.info("backend_loaded", backend="torch", precision=precision, device=str(self.device),
                 variant=variant, max_batch=max_batch)

    def _use_compile(self, mode: str) -> None:
        """What forward() calls: the module (or its two streams) compiled with `mode`, or not;
        with max-autotune for some batch sizes only, the default kernels for the rest."""
        self.compile_mode = mode
        some = mode == "max-autotune" and self.tuned_batches is not None
        self._runs_mode = "reduce-overhead" if some else mode
        self._runs = self._compiled_runs(self._runs_mode)
        self._tuned_runs = self._compiled_runs(mode) if some else self._runs
        self._tuned = (self.tuned_batches or frozenset()) if some else frozenset()

    def _compiled_runs(self, mode: str) -> Runs:
        module = self.module

        def as_run(m: torch.nn.Module) -> Run:
            return m if mode == "off" else torch_compile.compiled(
                m, mode, static=self.cuda_graph, dynamic_batch=self.dynamic_kernels)

        if isinstance(module, FusedTwoStream) and self.parallel_streams:
            return as_run(module), (as_run(module.origin), as_run(module.motion))
        return as_run(module), ()

    def _runs_for(self, batch: int) -> Runs:
        return self._tuned_runs if batch in self._tuned else self._runs

    def _mode_for(self, batch: int) -> str:
        return self.compile_mode if batch in self._tuned else self._runs_mode

    def _compile_failed(self, exc: Exception, mode: str, batch: int | None = None) -> None:
        log.warning("torch_compile_failed", mode=mode, batch=batch,
                    error=f"{type(exc).__name__}: {exc}"[:800],
                    action="serving the uncompiled module")
        self._use_compile("off")
        self.compile_failed = True

    def forward(self, x: torch.Tensor, side: torch.cuda.Stream | None = None) -> torch.Tensor:
        whole, streams = self._runs_for(len(x))
        if side is None or not streams:
            return whole(x.to(self.dtype)).float()
        origin, motion_stream = streams
        main = torch.cuda.current_stream(self.device)
        x = x.to(self.dtype)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            y_motion = motion_stream(motion(x, self._formula))
        y = origin(x)
        main.wait_stream(side)
        return (y + y_motion).float()

    def prepare(self, x: torch.Tensor, side: torch.cuda.Stream | None = None) -> None:
        """Run batch `x` twice, outside any graph: cuDNN's autotuning, the allocator's warm-up
        and, when compiling, this shape's compile. A failed compile falls back to the
        uncompiled module (one warning) rather than failing the start."""
        def twice() -> None:
            with torch.inference_mode():
                for _ in range(2):
                    self.forward(x, side)

        t0 = time.perf_counter()
        try:
            twice()
        except Exception as exc:
            if self.compile_mode == "off":
                raise
            torch.cuda.synchronize(self.device)
            self._compile_failed(exc, self.compile_mode, len(x))
            self.info.details["compile"] = "off (failed)"
            twice()
            return
        if self.compile_mode != "off" and len(x) not in self._compiled:
            torch.cuda.synchronize(self.device)
            self._compiled.add(len(x))
            log.info("torch_compiled", mode=self._mode_for(len(x)), batch=len(x),
                     seconds=round(time.perf_counter() - t0, 1))

    def _open_runner(self, buckets: Sequence[int], lanes: int) -> Runner:
        if self.device.type == "cpu":
            return HostRunner(self.info, self._compute_cpu, buckets, lanes)
        if self.optimized and self.cuda_graph:
            try:
                return CudaGraphRunner(self, buckets, lanes)
            except GraphsUnavailable as exc:
                log.warning("cuda_graph_unavailable", error=str(exc),
                            action="computing each batch on a worker thread, without graphs")
                if self.compile_mode != "off":  # static kernels were per bucket: dynamic now
                    self.cuda_graph = False
                    self._use_compile(self.compile_mode)
        if self.compile_mode != "off":
            # Compiled without our graphs: a second batch size makes inductor's kernels
            # dynamic in the batch, so that no request pays for a compile.
            for n in sorted(buckets)[:2]:
                self.prepare(torch.zeros((n, *self.info.input_shape), device=self.device))
        return HostRunner(self.info, self._compute_cuda, buckets, lanes)

    def runner_bytes(self, buckets: Sequence[int]) -> int:
        """On CUDA: activations grow linearly with the batch, so an eager forward pass at
        batch 1 and 2 (peak allocation above what was allocated before) gives the cost of
        the largest bucket, whose graph's pool the smaller buckets' graphs reuse (they are
        captured into it largest first); plus the runner's input and output buffers."""
        if self.device.type != "cuda":
            return 0
        if self._window_cost is None:
            one, two = self._peak(1), self._peak(2)
            self._window_cost = (max(one - (two - one), 0), max(two - one, 0))
        fixed, per_window = self._window_cost
        top = max(buckets)
        io = top * (int(np.prod(self.info.input_shape)) + self.info.num_class) * 4
        return fixed + per_window * top + io

    def _peak(self, batch: int) -> int:
        dev = self.device
        x = torch.zeros((batch, *self.info.input_shape), dtype=torch.float32, device=dev)
        side = torch.cuda.Stream(device=dev) if self.parallel_streams else None
        self.prepare(x, side)  # a compile's own allocations are not the runner's
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        with torch.inference_mode():
            self.forward(x, side)
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev) - base)

    def _compute_cpu(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.forward(torch.from_numpy(batch)).numpy()
        return out, (time.perf_counter() - t0) * 1e3

    def _compute_cuda(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        """A batch the seeds' way: pageable host copies, a synchronous `.cpu()`."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            x = torch.from_numpy(batch).to(self.device)
            out = self.forward(x).cpu().numpy()
        return out, (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        self.module = None  # type: ignore[assignment]
        self._runs = self._tuned_runs = (None, ())  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class CudaGraphRunner(Runner):
    """One executor's CUDA resources: a compute stream, a static device batch, one CUDA graph
    per bucket captured here (before READY, never on a request's path), and per-client lanes.

    A lane is a client's own CUDA stream. A batch's windows are uploaded each on its client's
    stream into its row of the static device input; the compute stream waits for those uploads
    (events), replays the bucket's graph, and each client's stream waits for the result and
    downloads its row (`cuda_batch.LanedBatch`, shared with TensorRT, in plain driver calls).
    With lanes=0 the batch moves in one copy each way on the compute stream.

    Capture and replay hold cuda_batch.CAPTURE_LOCK: torch refuses a replay while any thread
    captures ("Cannot prepare for replay during capturing stage"), which a reload's new runners
    would otherwise do while the old ones serve; a replay holds it for microseconds, and the
    loop retries a launch while another thread captures (`can_launch`). Where captures are
    global (torch 2.0), every CUDA call of this runner holds it: the launch, the completion
    query (which gives up at once while another thread captures), the wait and the timing.
    """

    def __init__(self, runtime: TorchRuntime, buckets: Sequence[int], lanes: int) -> None:
        super().__init__(runtime.info, buckets, lanes)
        self.runtime = runtime
        guard_all = CAPTURE_MODE == "global"
        self._guard_all = guard_all
        # What a launch holds, chosen once: the lock around every CUDA call with global
        # captures, else around the replay only.
        free: AbstractContextManager[object] = nullcontext()
        self._all_calls: AbstractContextManager[object]
        self._replay: AbstractContextManager[object]
        self._all_calls, self._replay = (CAPTURE_LOCK, free) if guard_all else (free,
                                                                              CAPTURE_LOCK)
        self._collected: tuple[np.ndarray, float] | None = None
        info, dev = runtime.info, runtime.device
        self.stream = torch.cuda.Stream(device=dev)
        self.side = torch.cuda.Stream(device=dev) if runtime.parallel_streams else None
        shape = (self.max_batch, *info.input_shape)
        self.host_in = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        self.host_out = torch.empty((self.max_batch, info.num_class), dtype=torch.float32,
                                    pin_memory=True)
        with torch.cuda.stream(self.stream):
            self.dev_in = torch.zeros(shape, dtype=torch.float32, device=dev)
        self.lane_streams = [torch.cuda.Stream(device=dev) for _ in range(self.lanes)]
        self.batch = LanedBatch(self.host_in.numpy(), self.host_out.numpy(),
                                self.dev_in.data_ptr(), self.stream.cuda_stream,
                                [s.cuda_stream for s in self.lane_streams])
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        try:
            # Largest first: the smaller buckets' graphs reuse the pool blocks the largest
            # one's capture made, so the runner's graphs take about one largest batch.
            for b in sorted(self.buckets, reverse=True):
                self._capture(b)
        except BaseException:
            self.close()
            raise
        torch.cuda.empty_cache()  # the eager warm-up passes' blocks, outside the pool

    def _capture(self, b: int) -> None:
        x = self.dev_in[:b]
        with torch.cuda.stream(self.stream):
            self.runtime.prepare(x, self.side)
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with CAPTURE_LOCK, torch.inference_mode(), \
                    _graph_capture(graph, self.pool, self.stream):
                out = self.runtime.forward(x, self.side)
        except Exception as exc:  # as trtexec does: no graph, say so once
            torch.cuda.synchronize(self.runtime.device)
            raise GraphsUnavailable(f"batch {b}: {type(exc).__name__}: {exc}") from exc
        self.graphs[b], self.outputs[b] = graph, out

    def attach(self) -> None:
        # The driver calls use the calling thread's current context: a runtime call makes the
        # device's primary context current in this thread (also on CUDA 11).
        torch.cuda.set_device(self.runtime.device)
        self.stream.query()
        self.batch.poll_only()

    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None:
        with self._all_calls:
            batch = self.batch
            batch.stage(windows)
            bad = first_failure(batch.upload(lanes), batch.start())
            with torch.cuda.stream(self.stream), self._replay:
                self.graphs[bucket].replay()
            batch.finish(int(self.outputs[bucket].data_ptr()), lanes, bad)

    def can_launch(self) -> bool:
        # A replay waits for the capture lock, which another thread holds for a whole
        # capture (a reload preparing its buckets): the I/O loop retries instead.
        return not CAPTURE_LOCK.locked()

    def done(self) -> bool:
        if not self._guard_all:
            return self.batch.done()
        if not CAPTURE_LOCK.acquire(blocking=False):
            return False  # another thread captures (global mode): look again later
        try:
            if not self.batch.done():
                return False
            self._collected = self.batch.collect()  # its timing query, under the lock too
            return True
        finally:
            CAPTURE_LOCK.release()

    def wait(self) -> None:
        with self._all_calls:
            self.batch.wait()
            if self._guard_all:
                self._collected = self.batch.collect()

    def _collect(self) -> np.ndarray:
        collected, self._collected = self._collected, None
        logits, compute_ms = collected if collected is not None else self.batch.collect()
        self.last_timings = {"compute_ms": compute_ms}
        return logits

    def close(self) -> None:
        with self._all_calls:
            self.stream.synchronize()
        self.graphs.clear()
        self.outputs.clear()
        if self.batch is not None:  # closed once already
            self.batch.destroy()
        self.lane_streams = []
        # Device and pinned memory go now, not whenever the runner is collected, and the
        # graphs' pool back to the device (the memory plan measures what runners take).
        self.dev_in = self.host_in = self.host_out = None  # type: ignore[assignment]
        self.batch = None  # type: ignore[assignment]
        torch.cuda.empty_cache()
