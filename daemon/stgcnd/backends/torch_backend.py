"""PyTorch backend: the inference-optimized graph (BatchNorm folded, channels-last) on CPU or CUDA.

CUDA sessions each own a `torch.cuda.Stream`, pinned host buffers for input and output, a static
device input, and (optionally) one CUDA graph per batch size captured on that stream: a graph
replay launches the whole network at once, which is what batch-1 latency is bound by on a GPU.

Precision: fp32 everywhere; fp16 on CUDA only. fp16 on the CPU is refused with a clear error
rather than silently run as bf16: bf16 is another number format (8-bit mantissa, ~1e-1 logit
differences on the demo model where fp16 on a GPU stays near 1e-2), and slower than fp32 on
CPUs without AMX / AVX512-BF16. It is offered explicitly instead, as precision "bf16" on the
CPU, for machines with AMX (Sapphire Rapids and later), where it runs ~3-4x faster than fp32.

`optimized=False` runs the plain network as the user trained it, with the host I/O the seeds'
benchmark uses (`torch.from_numpy(x).to(device)` ... `.cpu().numpy()`): the eager baseline row.
"""

from __future__ import annotations

import copy
import inspect
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from stgcnd.backends.base import Backend, BackendInfo, BatchRunner, Session
from stgcnd.backends.cuda import PREPARE_LOCK, raw_graph_exec
from stgcnd.backends.cuda_batch import LanedBatch
from stgcnd.errors import BackendUnavailable
from stgcnd.log import get_logger

log = get_logger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16")
_CAPTURE_LOCK = threading.Lock()
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# How a graph capture treats other threads' CUDA calls. torch 2.1+ captures "thread_local":
# only the capturing thread is restricted, so serving runners keep launching and polling.
# torch 2.0 (JetPack 5's NVIDIA wheel) has no capture_error_mode and captures in CUDA's
# "global" mode, where a potentially unsafe call from any other thread fails (and spoils the
# capture): there, a serving runner makes no CUDA call at all while another thread captures
# (see _CudaRunner). Passing the keyword to torch 2.0 raised TypeError.
_TAKES_CAPTURE_MODE = "capture_error_mode" in inspect.signature(
    torch.cuda.graph.__init__).parameters
CAPTURE_MODE = "thread_local" if _TAKES_CAPTURE_MODE else "global"


def _graph_capture(graph: Any, pool: Any, stream: Any) -> Any:
    """torch.cuda.graph in CAPTURE_MODE (torch 2.0 takes no mode: always global)."""
    mode = {"capture_error_mode": CAPTURE_MODE} if _TAKES_CAPTURE_MODE else {}
    return torch.cuda.graph(graph, pool=pool, stream=stream, **mode)


class TorchBackend(Backend):
    def __init__(self, model: Any, precision: str = "fp32", device: str = "cpu",
                 cuda_graph: bool = False, max_batch: int = 64, optimized: bool = True,
                 threads: int = 0, form: str = "channels_last") -> None:
        if precision not in PRECISIONS:
            raise BackendUnavailable(f"the torch backend runs fp32, fp16 (CUDA) or bf16 (CPU), "
                                     f"not {precision!r}; use the tensorrt or onnxruntime "
                                     "backend for int8")
        self.device = torch.device(device)
        if self.device.type == "cpu" and precision == "fp16":
            raise BackendUnavailable("fp16 needs CUDA with the torch backend; on the CPU use "
                                     "fp32, or bf16 explicitly on a CPU with AMX/AVX512-BF16 "
                                     "(faster, less exact)")
        if self.device.type == "cuda" and precision == "bf16":
            raise BackendUnavailable("use fp16 on CUDA (bf16 is offered for CPUs only)")
        if cuda_graph and self.device.type != "cuda":
            raise BackendUnavailable("CUDA graphs need --device cuda")
        if self.device.type == "cuda":
            from stgcnd.backends.cuda import init_cuda

            self.device = init_cuda("torch") if self.device.index is None else self.device
            # Fixed shapes: let cuDNN pick the fastest kernels once. fp32 must stay fp32 (TF32
            # convolutions differ from the CPU reference by ~1e-3, beyond the 1e-4 contract).
            torch.backends.cudnn.benchmark = True
            if precision == "fp32":
                torch.backends.cudnn.allow_tf32 = False
                torch.backends.cuda.matmul.allow_tf32 = False
        elif threads > 0:
            torch.set_num_threads(threads)
        self.dtype = _DTYPES[precision]
        self.optimized = optimized
        self.cuda_graph = cuda_graph
        if optimized:
            from stgcnd.model.optimized import optimize

            module = optimize(model.module, form)  # type: ignore[arg-type]
        elif self.device.type == "cpu" and precision == "fp32":
            module = model.module  # shared, unchanged: the reference network itself
        else:
            module = copy.deepcopy(model.module)  # never move the caller's network
        self.module = module.to(self.device, self.dtype).eval()
        # The two streams of a two-stream model are independent until their logits are
        # summed: on CUDA, sessions run the motion stream on a second CUDA stream, so that
        # (inside a CUDA graph, as two parallel branches) their small kernels overlap.
        self.parallel_streams = (optimized and self.device.type == "cuda"
                                 and hasattr(self.module, "motion")
                                 and hasattr(self.module, "origin"))
        for p in self.module.parameters():
            p.requires_grad_(False)
        self.capture_lock = _CAPTURE_LOCK
        variant = "optimized" if optimized else "eager"
        if cuda_graph:
            variant += "+cudagraph"
        self.info = BackendInfo(
            name="torch", precision=precision, device=str(self.device),
            input_shape=tuple(model.spec.input_shape), num_class=int(model.num_class),
            max_batch=int(max_batch), artifact=None,
            details={"variant": variant, "torch": torch.__version__,
                     "graph_op": getattr(model.spec, "graph_op", None),
                     **({"form": form} if optimized else {})})
        log.info("backend_loaded", backend="torch", precision=precision, device=str(self.device),
                 variant=variant, max_batch=max_batch)

    def forward(self, x: torch.Tensor, side: torch.cuda.Stream | None = None) -> torch.Tensor:
        if side is None or not self.parallel_streams:
            return self.module(x.to(self.dtype)).float()
        from stgcnd.model.stgcn import motion

        main = torch.cuda.current_stream(self.device)
        x = x.to(self.dtype)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            y_motion = self.module.motion(motion(x, self.module.motion_formula))
        y = self.module.origin(x)
        main.wait_stream(side)
        return (y + y_motion).float()

    def open_session(self) -> Session:
        if self.device.type == "cpu":
            return _CpuSession(self)
        if not self.optimized:
            return _EagerCudaSession(self)
        return _CudaSession(self)

    @property
    def nonblocking_runners(self) -> bool:
        # With CUDA graphs a batch is one graph launch; without, the launch itself enqueues
        # every kernel of the network from Python (milliseconds of the loop's time).
        return self.device.type == "cuda" and self.optimized and self.cuda_graph

    def open_runner(self, buckets: Sequence[int], lanes: int) -> BatchRunner:
        if self.device.type == "cuda" and self.optimized:
            return _CudaRunner(self, buckets, lanes)
        return super().open_runner(buckets, lanes)

    def close(self) -> None:
        self.module = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class _CpuSession(Session):
    """Copies each batch into the session's own float32 input buffer: the daemon's windows are
    read-only views of ZeroMQ frames (torch refuses to wrap those without a warning), and
    float16 windows are widened in the same copy."""

    backend: TorchBackend

    def __init__(self, backend: TorchBackend) -> None:
        super().__init__(backend)
        shape = (backend.info.max_batch, *backend.info.input_shape)
        self.host_in = torch.empty(shape, dtype=torch.float32)

    def _infer(self, batch: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        x = self.host_in[: batch.shape[0]]
        x.numpy()[...] = batch
        with torch.inference_mode():
            out = self.backend.forward(x).numpy()
        ms = (time.perf_counter() - t0) * 1e3
        self.last_timings = {"h2d_ms": 0.0, "compute_ms": ms, "d2h_ms": 0.0, "total_ms": ms}
        return out


class _EagerCudaSession(Session):
    """The seeds' way: pageable host copies, synchronous `.cpu()`; on the session's stream."""

    backend: TorchBackend

    def __init__(self, backend: TorchBackend) -> None:
        super().__init__(backend)
        self.stream: torch.cuda.Stream | None = torch.cuda.Stream(device=backend.device)

    def _infer(self, batch: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            x = torch.from_numpy(batch).to(self.backend.device).float()
            out = self.backend.forward(x).cpu().numpy()
        ms = (time.perf_counter() - t0) * 1e3
        self.last_timings = {"total_ms": ms}
        return out

    def _release(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
        self.stream = None


class _CudaSession(Session):
    """Pinned host buffers -> static device input -> network or graph replay -> pinned output."""

    backend: TorchBackend

    def __init__(self, backend: TorchBackend) -> None:
        super().__init__(backend)
        info, dev = backend.info, backend.device
        shape = (info.max_batch, *info.input_shape)
        self.stream: torch.cuda.Stream | None = torch.cuda.Stream(device=dev)
        self.side: torch.cuda.Stream | None = (torch.cuda.Stream(device=dev)
                                               if backend.parallel_streams else None)
        self.host_in = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        self.host_out = torch.empty((info.max_batch, info.num_class), dtype=torch.float32,
                                    pin_memory=True)
        self.host_in_np = self.host_in.numpy()
        self.host_out_np = self.host_out.numpy()
        with torch.cuda.stream(self.stream):
            self.dev_in = torch.zeros(shape, dtype=torch.float32, device=dev)
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle() if backend.cuda_graph else None

    def _capture(self, b: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # One capture at a time per process: entering a capture synchronizes the device, which
        # CUDA forbids while another thread's stream is capturing.
        with self.backend.capture_lock:
            return self._capture_locked(b)

    def _capture_locked(self, b: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        x = self.dev_in[:b]
        with torch.cuda.stream(self.stream):
            for _ in range(2):  # cuDNN autotuning and allocator warm-up happen outside the graph
                self.backend.forward(x, self.side)
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        # Thread-local capture: other sessions keep launching work on their own streams.
        with _graph_capture(graph, self.pool, self.stream):
            out = self.backend.forward(x, self.side)
        log.debug("cuda_graph_captured", batch=b)
        return graph, out

    def _infer(self, batch: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        b = batch.shape[0]
        np.copyto(self.host_in_np[:b], batch, casting="same_kind")
        ev = self.events
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            if self.backend.cuda_graph and b not in self.graphs:
                self.graphs[b] = self._capture(b)
            ev[0].record(self.stream)
            self.dev_in[:b].copy_(self.host_in[:b], non_blocking=True)
            ev[1].record(self.stream)
            if self.backend.cuda_graph:
                graph, out = self.graphs[b]
                graph.replay()
            else:
                out = self.backend.forward(self.dev_in[:b], self.side)
            ev[2].record(self.stream)
            self.host_out[:b].copy_(out, non_blocking=True)
            ev[3].record(self.stream)
        ev[3].synchronize()
        self.last_timings = {"h2d_ms": ev[0].elapsed_time(ev[1]),
                             "compute_ms": ev[1].elapsed_time(ev[2]),
                             "d2h_ms": ev[2].elapsed_time(ev[3]),
                             "total_ms": (time.perf_counter() - t0) * 1e3}
        return self.host_out_np[:b].copy()

    def _release(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
        self.graphs.clear()
        self.pool = None
        self.dev_in = self.host_in = self.host_out = None  # type: ignore[assignment]
        self.host_in_np = self.host_out_np = None  # type: ignore[assignment]
        self.events = []
        self.stream = self.side = None


class _CudaRunner(BatchRunner):
    """One executor's CUDA resources: a compute stream, a static device batch, one CUDA graph
    per bucket captured here (before READY, never on a request's path), and per-client lanes.

    A lane is a client's own CUDA stream. A batch's windows are uploaded each on its client's
    stream into its row of the static device input; the compute stream waits for those uploads
    (events), replays the bucket's graph, and each client's stream waits for the result and
    downloads its row. With lanes=0 the batch moves in one copy each way on the compute stream
    instead (fewer API calls per window; no per-client stream).

    A batch's host side is plain driver calls: the copies, events and completion of
    `cuda_batch.LanedBatch` (shared with TensorRT) and the graph's launch by its raw handle.
    torch builds (network, buffers, streams, graph capture) and only runs a batch itself
    where torch does not expose a graph's handle, or a bucket has no graph.

    Graph capture and replay hold the process-wide capture lock: torch's CUDA generator refuses
    a replay while any thread captures ("Cannot prepare for replay during capturing stage"),
    which a reload's new executors would otherwise do while the old ones serve. A replay only
    launches work, so the lock is held for microseconds.

    Where captures are global (torch 2.0, CAPTURE_MODE), every CUDA call of this runner holds
    that lock: the whole launch, the completion query (which gives up at once while another
    thread captures: "not done yet", look again), the wait and the result's timing. CUDA
    documents a global capture as prohibiting other threads' potentially unsafe calls; on the
    H100 (driver 580) an unguarded runner happened to survive them, which a Jetson's driver
    need not do, and the guard costs a lock where it applies and nothing elsewhere.
    """

    backend: TorchBackend

    def __init__(self, backend: TorchBackend, buckets: Sequence[int], lanes: int) -> None:
        super().__init__(backend, buckets, lanes)
        # With CUDA graphs _launch only enqueues, so the I/O loop can drive this runner
        # (BatchRunner.nonblocking); eagerly it would enqueue every kernel from the loop.
        self.nonblocking = backend.cuda_graph
        self._guard_all = CAPTURE_MODE == "global"
        # What a launch holds: with global captures, the lock around every CUDA call;
        # otherwise only around the replay. Chosen once here, not per batch.
        lock, free = backend.capture_lock, nullcontext()
        self._all_calls, self._replay = (lock, free) if self._guard_all else (free, lock)
        self._collected: tuple[np.ndarray, float] | None = None
        with PREPARE_LOCK:  # other executors' preparations wait; serving ones do not
            self._prepare_all()

    def _prepare_all(self) -> None:
        backend = self.backend
        info, dev = backend.info, backend.device
        self.stream = torch.cuda.Stream(device=dev)
        self.side = torch.cuda.Stream(device=dev) if backend.parallel_streams else None
        shape = (self.max_batch, *info.input_shape)
        self.host_in = torch.empty(shape, dtype=torch.float32, pin_memory=True)
        self.host_out = torch.empty((self.max_batch, info.num_class), dtype=torch.float32,
                                    pin_memory=True)
        self.host_in_np = self.host_in.numpy()
        self.host_out_np = self.host_out.numpy()
        with torch.cuda.stream(self.stream):
            self.dev_in = torch.zeros(shape, dtype=torch.float32, device=dev)
        self.lane_streams = [torch.cuda.Stream(device=dev) for _ in range(self.lanes)]
        # The batch's copies, stream ordering and completion (shared with TensorRT).
        self.batch = LanedBatch(self.host_in_np, self.host_out_np, self.dev_in.data_ptr(),
                                self.stream.cuda_stream,
                                [s.cuda_stream for s in self.lane_streams])
        self.outputs: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_execs: dict[int, int] = {}    # bucket -> cudaGraphExec_t, where exposed
        self.pool = torch.cuda.graph_pool_handle() if backend.cuda_graph else None
        self._eager_out: torch.Tensor | None = None
        for b in self.buckets:
            self._prepare(b)

    def _prepare(self, b: int) -> None:
        x = self.dev_in[:b]
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            for _ in range(2):  # cuDNN autotuning and allocator warm-up happen outside a graph
                self.backend.forward(x, self.side)
        self.stream.synchronize()
        if not self.backend.cuda_graph:
            return
        graph = torch.cuda.CUDAGraph()
        try:
            with self.backend.capture_lock, torch.inference_mode(), \
                    _graph_capture(graph, self.pool, self.stream):
                out = self.backend.forward(x, self.side)
        except Exception as exc:  # as trtexec does: no graph for this shape, say so once
            log.warning("cuda_graph_unavailable", batch=b, error=f"{type(exc).__name__}: "
                        f"{exc}", action="running this bucket without a CUDA graph")
            torch.cuda.synchronize(self.backend.device)
            return
        self.graphs[b], self.outputs[b] = graph, out
        handle = raw_graph_exec(graph)
        if handle is not None:
            self.graph_execs[b] = handle

    def attach(self) -> None:
        # The driver calls use the calling thread's current context; a runtime call makes the
        # device's primary context current in this thread (also on CUDA 11, where
        # cudaSetDevice alone does not).
        torch.cuda.set_device(self.backend.device)
        self.stream.query()
        self.batch.poll_only()

    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None:
        with self._all_calls:
            batch = self.batch
            batch.stage(windows)
            bad = batch.upload(lanes) | batch.start()
            handle = self.graph_execs.get(bucket)
            if handle is not None:
                with self._replay:
                    bad |= batch.ops.launch_graph(handle, batch.compute_stream)
                out = int(self.outputs[bucket].data_ptr())
            else:
                out = self._torch_forward(bucket)
            batch.finish(out, lanes, bad)

    def _torch_forward(self, bucket: int) -> int:
        """The bucket's graph replayed, or the network run, by torch on the compute stream
        (no raw graph handle from this torch, or no graph for this bucket); the output's
        device address. The output tensor is kept until collect: lanes read it."""
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            graph = self.graphs.get(bucket)
            if graph is not None:
                with self._replay:
                    graph.replay()
                out = self.outputs[bucket]
            else:
                out = self.backend.forward(self.dev_in[:bucket], self.side)
                self._eager_out = out
        return int(out.data_ptr())

    def can_launch(self) -> bool:
        # A replay waits for the process-wide capture lock, which another thread holds for a
        # whole capture (a reload preparing its buckets): the I/O loop retries instead.
        return not self.backend.capture_lock.locked()

    def done(self) -> bool:
        if not self._guard_all:
            return self.batch.done()
        lock = self.backend.capture_lock
        if not lock.acquire(blocking=False):
            return False  # another thread captures (global mode): look again later
        try:
            if not self.batch.done():
                return False
            self._collected = self.batch.collect()  # its timing query, under the lock too
            return True
        finally:
            lock.release()

    def wait(self) -> None:
        if not self._guard_all:
            self.batch.wait()
            return
        with self._all_calls:
            self.batch.wait()
            self._collected = self.batch.collect()

    def _collect(self) -> np.ndarray:
        # After done() or wait(), as BatchRunner.collect requires: no second synchronize.
        self._eager_out = None
        collected, self._collected = self._collected, None
        logits, compute_ms = collected if collected is not None else self.batch.collect()
        self.last_timings = {"compute_ms": compute_ms}
        return logits

    def close(self) -> None:
        with self._all_calls:
            self.stream.synchronize()
        self.graphs.clear()
        self.graph_execs.clear()
        self.outputs.clear()
        self.pool = None
        self._eager_out = None
        self.batch.destroy()
        self.lane_streams = []
