"""TensorRT backend: a serialized engine run with pycuda on the primary CUDA context.

Never imports torch: on an 8 GB Jetson the serving process shares memory with the cameras'
own models, and torch alone costs several hundred MB.

Only the name-based tensor API is used (TensorRT 8.5 to 11.x): `num_io_tensors`,
`get_tensor_name`, `get_tensor_mode`, `get_tensor_shape`, `get_tensor_dtype`,
`get_tensor_profile_shape`, `set_input_shape`, `set_tensor_address`, `execute_async_v3`.
Bindings-index calls (`get_binding_*`, `execute_async_v2`) are gone in 10.x; context managers
on TensorRT objects are deprecated no-ops, so objects are released with `del`.

A session owns an execution context, a pycuda stream, page-locked host buffers and device
buffers sized for the largest batch. One inference: copy into the pinned input, async H2D,
`execute_async_v3` (or the launch of a CUDA graph captured from it, one per batch size), async
D2H, wait on the stream.

The daemon's executors use `open_runner` instead (the `BatchRunner` contract in base.py): one
execution context per batch bucket, each on its own optimization profile when the engine has
one per bucket (stgcnd builds them so; TensorRT 8.x lets a profile serve one context at a
time), and one lane (a stream and two events) per client. See `_TrtRunner`.

Every context gets its profile with `set_optimization_profile_async`, checked: on 8.x only the
first context of an engine starts on profile 0, the others have none until told.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd import runtimes
from stgcnd.backends.base import Backend, BackendInfo, BatchRunner, Session
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.log import get_logger

log = get_logger(__name__)

# Every TensorRT name this module touches, checked at load so that a release that lacks one
# fails with a clear message instead of an AttributeError mid-inference.
REQUIRED_API: dict[str, tuple[str, ...]] = {
    "Logger": ("WARNING",),
    "Runtime": ("deserialize_cuda_engine",),
    "ICudaEngine": ("num_io_tensors", "get_tensor_name", "get_tensor_mode", "get_tensor_shape",
                    "get_tensor_dtype", "get_tensor_profile_shape", "num_optimization_profiles",
                    "create_execution_context"),
    "IExecutionContext": ("set_input_shape", "set_tensor_address", "execute_async_v3",
                          "get_tensor_shape", "set_optimization_profile_async"),
    "ILogger": ("log", "Severity"),
    "TensorIOMode": ("INPUT", "OUTPUT"),
    "DataType": ("FLOAT", "HALF", "INT8", "INT32", "BOOL"),
}

# pycuda names the sessions and runners call (tests check them against a real pycuda build).
PYCUDA_API = ("Stream", "Event", "wait_for_event", "record", "time_since", "synchronize",
              "mem_alloc", "memset_d8", "pagelocked_empty", "memcpy_htod_async",
              "memcpy_dtoh_async", "retain_primary_context", "get_current", "push", "pop")

# I/O data types by enum *name*: INT64 and BF16 appear in 10.x, FP4/E8M0 in 11.x; a name the
# running release lacks simply never occurs.
_NUMPY_BY_TRT_NAME = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8,
                      "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_, "UINT8": np.uint8}

# Names used where present, with a fallback where not (feature detection, not required):
# get_tensor_profile_shape is the name-based profile query of 8.6+; 8.5 may only have the
# older get_profile_shape(profile, name), which 10.x removed.
OPTIONAL_API: dict[str, tuple[str, ...]] = {
    "ICudaEngine": ("get_tensor_profile_shape", "get_profile_shape"),
}


def import_tensorrt() -> Any:
    """The `tensorrt` module, checked for the name-based tensor API this backend uses."""
    trt = runtimes.import_tensorrt()
    missing = missing_api(trt)
    if missing:
        raise BackendUnavailable(f"TensorRT {version_of(trt)} lacks {', '.join(missing)}; stgcnd "
                                 "needs TensorRT 8.5 or newer (name-based tensor API)")
    return trt


def serving_options(trt: Any, options: Any) -> Any:
    """The build options the daemon serves with on this TensorRT (`options`: BuildOptions).

    A configuration written for JetPack 6 says `fp16`; TensorRT 11 builds networks strongly
    typed and has no FP16 builder flag, so that precision cannot be built there from stgcnd's
    fp32 ONNX. `stgcnd build --precision fp16` refuses with the reason; the daemon instead
    serves fp32 and says so once (`precision_fallback`), rather than refusing to start.
    """
    import dataclasses

    from stgcnd.engines.builders.tensorrt import precision_plan

    if options.precision != "fp16":
        return options
    try:
        precision_plan(trt, "fp16")
    except UserError as exc:
        log.warning("precision_fallback", backend="tensorrt", asked="fp16", using="fp32",
                    tensorrt=version_of(trt), reason=str(exc))
        return dataclasses.replace(options, precision="fp32")
    return options


def version_of(trt: Any) -> str:
    return str(getattr(trt, "__version__", "unknown"))


def missing_api(trt: Any) -> list[str]:
    """Names in REQUIRED_API that this tensorrt module does not have."""
    out = []
    for cls_name, members in REQUIRED_API.items():
        cls = getattr(trt, cls_name, None)
        if cls is None:
            out.append(cls_name)
            continue
        out.extend(f"{cls_name}.{m}" for m in members if not hasattr(cls, m))
    return out


def numpy_dtype(trt_dtype: Any) -> np.dtype:
    """The numpy dtype of a TensorRT I/O tensor type; a clear error for types numpy lacks."""
    name = getattr(trt_dtype, "name", str(trt_dtype).rsplit(".", 1)[-1])
    if name not in _NUMPY_BY_TRT_NAME:
        raise BackendUnavailable(f"the engine has an I/O tensor of type {name}, which numpy "
                                 "cannot hold; rebuild it with float32 inputs and outputs "
                                 "(stgcnd build keeps I/O in float32 at every precision)")
    return np.dtype(_NUMPY_BY_TRT_NAME[name])


def logger(trt: Any) -> Any:
    """The process's one TensorRT logger, shared with the builder (stgcnd.runtimes)."""
    return runtimes.tensorrt_logger(trt)


def profile_shapes(engine: Any, name: str, profile: int) -> list[tuple[int, ...]]:
    """[min, opt, max] shapes of input `name` in `profile` (8.5 to 11.x)."""
    if hasattr(engine, "get_tensor_profile_shape"):
        shapes = engine.get_tensor_profile_shape(name, profile)
    else:  # TensorRT 8.5: the older call, which takes the tensor name too
        shapes = engine.get_profile_shape(profile, name)
    return [tuple(int(d) for d in s) for s in shapes]


def profile_batch_ranges(engine: Any, input_name: str) -> list[tuple[int, int, int]]:
    """(min, opt, max) batch of every optimization profile, in profile order."""
    return [tuple(s[0] for s in profile_shapes(engine, input_name, i))  # type: ignore[misc]
            for i in range(int(engine.num_optimization_profiles))]


@dataclass(frozen=True)
class ContextPlan:
    """Which execution contexts a runner makes: bucket -> optimization profile."""

    profiles: dict[int, int]     # bucket -> profile index of its context
    per_bucket: bool             # one context per bucket (else one context, shapes in turn)

    @property
    def buckets(self) -> tuple[int, ...]:
        return tuple(sorted(self.profiles))


def plan_contexts(buckets: Sequence[int], ranges: Sequence[tuple[int, int, int]],
                  dynamic: bool) -> ContextPlan:
    """Map the runner's buckets onto the engine's optimization profiles.

    With one profile per bucket (what stgcnd builds), each bucket gets a context of its own on
    the profile that holds it; a requested bucket inside a profile's range is widened to that
    profile's largest batch, so no two contexts share a profile (TensorRT 8.x forbids it for
    contexts in use at the same time). An engine with a single profile (or a static batch)
    gets one context for every bucket, whose input shape is set per run.
    """
    if not dynamic or len(ranges) <= 1:
        return ContextPlan({b: 0 for b in buckets}, per_bucket=False)
    chosen: dict[int, int] = {}
    for b in buckets:
        for index, (low, _opt, high) in enumerate(ranges):
            if low <= b <= high:
                chosen[high] = index
                break
        else:
            raise UserError(f"no optimization profile of the engine holds batch {b}; "
                            "rebuild it with `stgcnd build --max-batch N`")
    return ContextPlan(chosen, per_bucket=True)


def graphs_allowed(plan: ContextPlan) -> bool:
    """CUDA graphs bake a context's shapes in: with one context shared by several buckets
    (shapes changed in turn) a graph would replay stale shapes, so none are captured."""
    return plan.per_bucket or len(plan.profiles) == 1


def set_profile(context: Any, profile: int, stream_handle: int) -> None:
    """Bind `context` to `profile`, checked (TensorRT answers False, e.g. when a profile is
    already in use by another live context on 8.x)."""
    if not context.set_optimization_profile_async(profile, stream_handle):
        raise BackendUnavailable(
            f"TensorRT could not bind an execution context to optimization profile {profile} "
            "(on TensorRT 8.x a profile serves one execution context at a time); close idle "
            "sessions, or rebuild with `stgcnd build --max-batch N` for one profile per "
            "batch bucket")


def set_batch(context: Any, tensor: TensorIO, batch: int) -> None:
    if any(d < 0 for d in tensor.shape) and not context.set_input_shape(
            tensor.name, (batch, *tensor.shape[1:])):
        raise UserError(f"the engine does not accept batch {batch} (its optimization "
                        "profiles say which batches it takes: `stgcnd engines list`)")


@dataclass(frozen=True)
class TensorIO:
    name: str
    is_input: bool
    dtype: np.dtype
    shape: tuple[int, ...]        # as built; -1 for a dynamic dimension
    max_shape: tuple[int, ...]    # the largest shape the session allocates


def engine_io(trt: Any, engine: Any, max_batch: int) -> list[TensorIO]:
    """The engine's I/O tensors; dynamic batch dimensions bounded by the largest batch any
    optimization profile takes, and by max_batch (outputs too: no larger than the inputs)."""
    found = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        found.append((name, is_input, shape))
    profiles = int(getattr(engine, "num_optimization_profiles", 1))
    top = max_batch
    max_shapes: dict[str, tuple[int, ...]] = {}
    for name, is_input, shape in found:
        if is_input and any(d < 0 for d in shape):
            prof_max = max((profile_shapes(engine, name, p)[2] for p in range(profiles)),
                           key=lambda s: s[0])
            max_shapes[name] = (min(prof_max[0], max_batch), *prof_max[1:])
            top = min(top, max_shapes[name][0])
    return [TensorIO(name, is_input, numpy_dtype(engine.get_tensor_dtype(name)), shape,
                     max_shapes.get(name, tuple(top if d < 0 else d for d in shape)))
            for name, is_input, shape in found]


class TensorRTBackend(Backend):
    def __init__(self, engine_path: Path, input_shape: tuple[int, ...], num_class: int,
                 max_batch: int = 1, precision: str = "fp32", cuda_graph: bool = False) -> None:
        trt = import_tensorrt()
        engine_path = Path(engine_path)
        if not engine_path.is_file():
            raise UserError(f"TensorRT engine {engine_path} not found; build it with "
                            "`stgcnd build --backend tensorrt`")
        data = engine_path.read_bytes()
        from stgcnd.backends.cuda import init_cuda, pycuda_current

        init_cuda("pycuda")  # the primary context exists before the runtime touches CUDA
        with pycuda_current():
            self.runtime = trt.Runtime(logger(trt))
            self.engine = self.runtime.deserialize_cuda_engine(data)
        if self.engine is None:
            raise UserError(f"TensorRT {version_of(trt)} could not load {engine_path}: engines "
                            "only run on the TensorRT version and GPU they were built with; "
                            "rebuild with `stgcnd build --backend tensorrt`")
        self.trt = trt
        self.io = engine_io(trt, self.engine, max_batch)
        inputs = [t for t in self.io if t.is_input]
        if len(inputs) != 1:
            raise UserError(f"{engine_path} has {len(inputs)} inputs; expected one window input")
        self.input = inputs[0]
        self.dynamic = any(d < 0 for d in self.input.shape)
        self.profile_ranges = (profile_batch_ranges(self.engine, self.input.name)
                               if self.dynamic else [(1, 1, 1)])
        self.cuda_graph = cuda_graph
        # Set once, by the first session or runner whose capture fails: from then on no one
        # in this process captures again (a failure is logged once, not per request).
        self.graph_failure: str | None = None
        self._lock = threading.Lock()
        self.info = BackendInfo(
            name="tensorrt", precision=precision, device="cuda:0",
            input_shape=tuple(input_shape), num_class=int(num_class),
            max_batch=int(self.input.max_shape[0]), artifact=str(engine_path),
            details={"tensorrt": version_of(trt), "cuda_graph": cuda_graph,
                     "profiles": [list(r) for r in self.profile_ranges],
                     "io": {t.name: {"dtype": t.dtype.name, "shape": list(t.shape)}
                            for t in self.io}})
        log.info("backend_loaded", backend="tensorrt", precision=precision,
                 path=str(engine_path), tensorrt=version_of(trt), cuda_graph=cuda_graph,
                 profiles=len(self.profile_ranges))

    @classmethod
    def from_artifact(cls, artifact: Any, cuda_graph: bool = False) -> TensorRTBackend:
        m = artifact.manifest
        if artifact.path is None:
            raise UserError("the TensorRT artefact has no engine file; rebuild it with "
                            "`stgcnd build --backend tensorrt`")
        return cls(Path(artifact.path), tuple(m["input_shape"]), int(m["num_class"]),
                   int(m.get("max_batch", 1)), artifact.precision, cuda_graph)

    def open_session(self) -> Session:
        return _TrtSession(self)

    @property
    def nonblocking_runners(self) -> bool:
        # With CUDA graphs a batch is one graph launch; a runner whose graphs are not allowed
        # or fail turns blocking again, and dispatch "auto" then falls back to threads.
        return bool(self.cuda_graph) and self.graph_failure is None

    def open_runner(self, buckets: Sequence[int], lanes: int) -> BatchRunner:
        """One executor's contexts, lanes and graphs; call in the executor thread."""
        return _TrtRunner(self, buckets, lanes)

    def graphs_failed(self, what: str, error: str) -> None:
        with self._lock:
            first = self.graph_failure is None
            self.graph_failure = self.graph_failure or error
        if first:
            log.warning("cuda_graphs_disabled", backend="tensorrt", what=what, error=error,
                        action="running every bucket without CUDA graphs")

    def profile_for_batch(self, batch: int) -> int:
        for index, (low, _opt, high) in enumerate(self.profile_ranges):
            if low <= batch <= high:
                return index
        raise UserError(f"batch {batch} outside the engine's optimization profiles "
                        f"{self.profile_ranges}")

    def new_context(self, profile: int, stream_handle: int) -> Any:
        """An execution context bound to `profile` (always set and checked: TensorRT 8.x
        starts only an engine's first context on profile 0)."""
        context = self.engine.create_execution_context()
        if context is None:
            raise BackendUnavailable("TensorRT could not create an execution context (GPU "
                                     "memory exhausted?); close idle sessions")
        set_profile(context, profile, stream_handle)
        return context

    def close(self) -> None:
        from stgcnd.backends.cuda import pycuda_current

        with pycuda_current():
            self.engine = None
            self.runtime = None


def _free(mems: Sequence[Any]) -> None:
    for mem in mems:
        mem.free()


class _TrtSession(Session):
    """One client's context, stream and buffers (the pre-runner path: bench, validate)."""

    backend: TensorRTBackend

    def __init__(self, backend: TensorRTBackend) -> None:
        super().__init__(backend)
        import pycuda.driver as cuda

        from stgcnd.backends.cuda import pycuda_current

        self.cuda = cuda
        self.graphs: dict[int, Any] = {}
        self.host: dict[str, np.ndarray] = {}
        self.device: dict[str, Any] = {}
        self.input = backend.input
        self.outputs = [t for t in backend.io if not t.is_input]
        self._batch = -1
        with pycuda_current():
            self.stream = cuda.Stream()
            self.events = [cuda.Event() for _ in range(4)]
            self.profile = 0
            self.context = backend.new_context(self.profile, self.stream.handle)
            for t in backend.io:
                self.host[t.name] = cuda.pagelocked_empty(t.max_shape, t.dtype)
                self.device[t.name] = cuda.mem_alloc(max(self.host[t.name].nbytes, 1))
                self.context.set_tensor_address(t.name, int(self.device[t.name]))

    def _set_batch(self, b: int) -> None:
        if b == self._batch:
            return
        if self.backend.dynamic:
            profile = self.backend.profile_for_batch(b)
            if profile != self.profile:
                set_profile(self.context, profile, self.stream.handle)
                self.profile = profile
                for g in self.graphs.values():  # captured under the old profile
                    g.destroy()
                self.graphs.clear()
        set_batch(self.context, self.input, b)
        self._batch = b

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self.stream.handle):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the tensorrt_log events)")

    def _graph_for(self, b: int) -> Any:
        """The batch's CUDA graph, captured on first use; None once capture has failed."""
        from stgcnd.backends.cuda import CAPTURE_LOCK, DriverGraph

        if not self.backend.cuda_graph or self.backend.graph_failure is not None:
            return None
        if b not in self.graphs:
            self._enqueue()  # the first enqueue after a shape change does deferred setup
            self.stream.synchronize()
            graph = DriverGraph(self.stream.handle)
            with CAPTURE_LOCK:
                try:
                    graph.capture(self._enqueue)
                except Exception as exc:
                    self.backend.graphs_failed(f"batch {b}", str(exc))
                    return None
            self.graphs[b] = graph
        return self.graphs[b]

    def _infer(self, batch: np.ndarray) -> np.ndarray:
        from stgcnd.backends.cuda import pycuda_current

        cuda, ev = self.cuda, self.events
        t0 = time.perf_counter()
        b = batch.shape[0]
        with pycuda_current():
            self._set_batch(b)
            host_in = self.host[self.input.name][:b]
            np.copyto(host_in, batch, casting="same_kind")
            graph = self._graph_for(b)
            ev[0].record(self.stream)
            cuda.memcpy_htod_async(self.device[self.input.name], host_in, self.stream)
            ev[1].record(self.stream)
            if graph is not None:
                graph.launch()
            else:
                self._enqueue()
            ev[2].record(self.stream)
            outs = []
            for t in self.outputs:
                rows = self.host[t.name][:b]
                cuda.memcpy_dtoh_async(rows, self.device[t.name], self.stream)
                outs.append(rows)
            ev[3].record(self.stream)
            self.stream.synchronize()
            self.last_timings = {"h2d_ms": ev[1].time_since(ev[0]),
                                 "compute_ms": ev[2].time_since(ev[1]),
                                 "d2h_ms": ev[3].time_since(ev[2]),
                                 "total_ms": (time.perf_counter() - t0) * 1e3}
        return np.array(outs[0], dtype=np.float32)

    def _release(self) -> None:
        # In the closing thread, with the context current: pycuda objects left to the garbage
        # collector would be freed in whatever thread collects them, context or not.
        from stgcnd.backends.cuda import pycuda_current

        with pycuda_current():
            self.stream.synchronize()
            for g in self.graphs.values():
                g.destroy()
            self.graphs.clear()
            self.context = None
            _free(list(self.device.values()))
            self.device.clear()
            self.host.clear()  # page-locked memory is unpinned when the arrays are collected
            self.events = []
            self.stream = None


class _TrtRunner(BatchRunner):
    """The batched executor's TensorRT resources (see base.BatchRunner).

    One batch (`cuda_batch.LanedBatch`, shared with the torch runner): the windows are staged
    into the runner's pinned rows, each uploaded on its client's stream (lane) into its slot
    of the shared device input; the compute stream waits on every upload, launches the
    bucket's CUDA graph (or enqueues its context), and each lane's stream waits for the
    compute and downloads its logits row. compute_ms is timed with events on the compute
    stream alone. Only the compute step here is TensorRT's; the rest runs on every GPU test
    machine through torch.

    `launch` only enqueues, so with CUDA graphs the I/O loop drives this runner itself
    (dispatch "auto"): `attach` makes the primary context current in the loop's thread until
    `close` (in the same thread). An executor thread (dispatch "thread") makes it current per
    call instead.
    """

    backend: TensorRTBackend

    def __init__(self, backend: TensorRTBackend, buckets: Sequence[int], lanes: int) -> None:
        super().__init__(backend, buckets, lanes)
        from stgcnd.backends.cuda import PREPARE_LOCK, DriverMemory, pycuda_current
        from stgcnd.backends.cuda_batch import LanedBatch

        self.plan = plan_contexts(self.buckets, backend.profile_ranges, backend.dynamic)
        self.buckets = self.plan.buckets
        self.input = backend.input
        self.output = next(t for t in backend.io if not t.is_input)
        self.contexts: dict[int, Any] = {}
        self.graphs: dict[int, Any] = {}
        self._shape: dict[int, int] = {}          # id(context) -> batch its shape is set to
        self.use_graphs = backend.cuda_graph and graphs_allowed(self.plan)
        self._held = False  # attach made the context current in the driving thread
        # Without a graph a launch enqueues every kernel from Python (execute_async_v3): not
        # blocking, but too costly for the I/O loop's thread.
        self.nonblocking = self.use_graphs
        if backend.cuda_graph and not self.use_graphs:
            log.info("cuda_graphs_skipped", backend="tensorrt", buckets=list(self.buckets),
                     reason="the engine has one optimization profile for several buckets; "
                            "rebuild it (stgcnd build) for one profile per bucket")
        rows = self.max_batch
        # One runner prepared at a time (see cuda.PREPARE_LOCK): allocations and context
        # creation are not legal while another executor captures a graph. Streams and memory
        # come from the driver (cuda.DriverMemory), not pycuda: the I/O loop may close this
        # runner in another thread than the one preparing it.
        with PREPARE_LOCK, pycuda_current():
            self.memory = memory = DriverMemory()
            try:
                self.compute = memory.stream()
                self.dev_in = memory.device_zeros(rows * self._row_bytes(self.input),
                                                  self.compute)
                self.dev_out = memory.device_zeros(rows * self._row_bytes(self.output),
                                                   self.compute)
                others = [t for t in backend.io if not t.is_input and t is not self.output]
                self.dev_other = {t.name: memory.device_zeros(
                    int(np.prod(t.max_shape)) * t.dtype.itemsize, self.compute)
                    for t in others}
                shared = None
                for b in self.buckets:
                    profile = self.plan.profiles[b]
                    if shared is None or self.plan.per_bucket:
                        shared = backend.new_context(profile, self.compute)
                        for name, ptr in self._addresses().items():
                            shared.set_tensor_address(name, ptr)
                        if self.plan.per_bucket:
                            self._set_shape(shared, b)
                    self.contexts[b] = shared
                self.lane_streams = [memory.stream() for _ in range(self.lanes)]
                # Pinned rows per batch slot, not per client: max_batch windows, whatever
                # the number of cameras.
                self.host_in = memory.pinned((rows, *self.input.max_shape[1:]),
                                             self.input.dtype)
                self.host_out = memory.pinned((rows, *self.output.max_shape[1:]),
                                              self.output.dtype)
                self.batch = LanedBatch(self.host_in, self.host_out, self.dev_in,
                                        self.compute, self.lane_streams)
            except BaseException:
                self.contexts.clear()
                memory.free()
                raise
        log.info("tensorrt_runner_ready", buckets=list(self.buckets),
                 contexts=len({id(c) for c in self.contexts.values()}),
                 per_bucket_profiles=self.plan.per_bucket, lanes=self.lanes,
                 cuda_graph=self.use_graphs)

    @staticmethod
    def _row_bytes(t: TensorIO) -> int:
        return int(np.prod(t.max_shape[1:], dtype=np.int64)) * t.dtype.itemsize

    def _addresses(self) -> dict[str, int]:
        return {self.input.name: self.dev_in, self.output.name: self.dev_out, **self.dev_other}

    def _set_shape(self, context: Any, batch: int) -> None:
        if self._shape.get(id(context)) != batch:
            set_batch(context, self.input, batch)
            self._shape[id(context)] = batch

    def _enqueue(self, bucket: int) -> bool:
        if not self.contexts[bucket].execute_async_v3(self.compute):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the tensorrt_log events)")
        return True

    def warm_up(self, runs: int = 3) -> dict[int, float]:
        """Capture one CUDA graph per bucket (when asked and allowed), then time every bucket.
        A failed capture is not fatal: logged once, and every bucket runs without a graph."""
        from stgcnd.backends.cuda import CAPTURE_LOCK, PREPARE_LOCK, DriverGraph, pycuda_current

        if self.use_graphs and self.backend.graph_failure is None:
            # A bucket's first enqueue does deferred set-up: not while another executor captures.
            with PREPARE_LOCK, pycuda_current():
                for b in self.buckets:
                    self._set_shape(self.contexts[b], b)
                    self._enqueue(b)  # deferred set-up happens outside the capture
                    self.memory.synchronize(self.compute)
                    graph = DriverGraph(self.compute)
                    with CAPTURE_LOCK:
                        try:
                            graph.capture(lambda b=b: self._enqueue(b))
                        except Exception as exc:
                            self.backend.graphs_failed(f"bucket {b}", str(exc))
                            break
                    self.graphs[b] = graph
                if self.backend.graph_failure is not None:
                    self._drop_graphs()
        return super().warm_up(runs)

    def _drop_graphs(self) -> None:
        for g in self.graphs.values():
            g.destroy()
        self.graphs.clear()
        self.use_graphs = False
        self.nonblocking = False

    def attach(self) -> None:
        from stgcnd.backends.cuda import hold_current

        hold_current()  # released by close, in the same thread
        self._held = True
        self.batch.poll_only()

    def _current(self) -> Any:
        """The context made current for a block: already so in the thread that attached
        (the I/O loop: nothing to do per batch), pushed and popped around it elsewhere."""
        if self._held:
            return contextlib.nullcontext()
        from stgcnd.backends.cuda import pycuda_current

        return pycuda_current()

    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None:
        batch = self.batch
        batch.stage(windows)
        with self._current():
            bad = batch.upload(lanes) | batch.start()
            graph = self.graphs.get(bucket) if self.use_graphs else None
            if graph is not None:
                bad |= batch.ops.launch_graph(graph.exec_handle, batch.compute_stream)
            else:
                self._set_shape(self.contexts[bucket], bucket)
                self._enqueue(bucket)
            batch.finish(self.dev_out, lanes, bad)

    def done(self) -> bool:
        return self.batch.done()

    def wait(self) -> None:
        with self._current():
            self.batch.wait()

    def _collect(self) -> np.ndarray:
        with self._current():
            logits, compute_ms = self.batch.collect()
        self.last_timings = {"compute_ms": compute_ms}
        return logits

    def close(self) -> None:
        """Free everything, from any thread (the one that prepared it, or the I/O loop's),
        with the context current; idempotent."""
        from stgcnd.backends.cuda import pycuda_current

        if not self.contexts:
            return
        try:
            with pycuda_current():
                self.memory.synchronize_all()  # before graphs and contexts go
                self._drop_graphs()
                # Execution contexts before the memory they address.
                self.contexts.clear()
                self._shape.clear()
                self.batch.destroy()
                self.host_in = self.host_out = None
                self.memory.free()
                self.dev_other.clear()
                self.lane_streams = []
        finally:
            self.detach()

    def detach(self) -> None:
        if self._held:
            from stgcnd.backends.cuda import release_current

            self._held = False
            release_current()
