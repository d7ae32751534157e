"""TensorRT: a serialized engine run on the primary CUDA context through the driver layer.

Never imports torch (on an 8 GB Jetson it costs several hundred MB) nor pycuda: streams,
memory and graphs come from `runtimes.cuda`. Only the name-based tensor API, which TensorRT
8.5 to 11.x all have, is used.
"""

from __future__ import annotations

import collections
import functools
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.log import get_logger
from stgcnd.runtimes import import_tensorrt
from stgcnd.runtimes.base import Runner, Runtime, RuntimeInfo, normalize_buckets
from stgcnd.runtimes.cuda import CudaError, error_name, first_failure, make_current
from stgcnd.runtimes.cuda_batch import (
    CAPTURE_LOCK,
    DriverGraph,
    DriverMemory,
    GraphsUnavailable,
    LanedBatch,
)

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

# I/O data types by enum *name*: INT64 and BF16 appear in 10.x, FP4/E8M0 in 11.x; a name the
# running release lacks simply never occurs.
_NUMPY_BY_TRT_NAME = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8,
                      "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_, "UINT8": np.uint8}

def version_of(trt: Any) -> str:
    return str(getattr(trt, "__version__", "unknown"))


# Only the name-based tensor API is used, which TensorRT 8.5 to 11.x all have: `num_io_tensors`,
# `get_tensor_name`, `get_tensor_mode`, `get_tensor_shape`, `get_tensor_dtype`,
# `get_tensor_profile_shape`, `set_input_shape`, `set_tensor_address`, `execute_async_v3`.
# Bindings-index calls (`get_binding_*`, `execute_async_v2`) are gone in 10.x; context managers
# on TensorRT objects are deprecated no-ops, so objects are released with `del`.
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


def profile_shapes(engine: Any, name: str, profile: int) -> list[tuple[int, ...]]:
    """[min, opt, max] shapes of input `name` in `profile` (8.5 to 11.x)."""
    return [tuple(int(d) for d in s) for s in engine.get_tensor_profile_shape(name, profile)]


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
                  dynamic: bool, taken: frozenset[int] = frozenset()) -> ContextPlan:
    """Map the runner's buckets onto the engine's optimization profiles.

    With one profile per bucket (what stgcnd builds), each bucket gets a context of its own on
    the profile that holds it; a requested bucket inside a profile's range is widened to that
    profile's largest batch, so no two contexts share a profile (TensorRT forbids it for
    contexts in use at the same time). Profiles `taken` by other runners of the same engine
    (instances > 1: the engine has a set of profiles per instance) are passed over. An engine
    with a single profile (or a static batch) gets one context for every bucket, whose input
    shape is set per run.
    """
    if not dynamic or len(ranges) <= 1:
        if 0 in taken:
            raise UserError("the TensorRT engine has one optimization profile and another "
                            "runner uses it; instances > 1 need an engine built for them "
                            "(the store rebuilds it when instances changes)")
        return ContextPlan({b: 0 for b in buckets}, per_bucket=False)
    chosen: dict[int, int] = {}
    for b in buckets:
        holds = [i for i, (low, _opt, high) in enumerate(ranges) if low <= b <= high]
        free = [i for i in holds if i not in taken and i not in chosen.values()]
        if not holds:
            raise UserError(f"no optimization profile of the engine holds batch {b}; "
                            "rebuild it with `stgcnd build --max-batch N`")
        if b in chosen or ranges[holds[0]][2] in chosen:
            continue  # widened onto a bucket already planned
        if not free:
            raise UserError(f"every optimization profile of the engine that holds batch {b} "
                            "is used by another runner; instances > 1 need an engine with a "
                            "profile set per instance (the store rebuilds it when instances "
                            "changes)")
        chosen[ranges[free[0]][2]] = free[0]
    return ContextPlan(chosen, per_bucket=True)


def graphs_allowed(plan: ContextPlan) -> bool:
    """CUDA graphs bake a context's shapes in: with one context shared by several buckets
    (shapes changed in turn) a graph would replay stale shapes, so none are captured."""
    return plan.per_bucket or len(plan.profiles) == 1


def checked_call(what: str, fix: str, call: Callable[[], object]) -> None:
    """Run a TensorRT call that answers whether it worked; on failure raise one
    BackendUnavailable that says `what` failed, with TensorRT's own errors logged meanwhile
    (held back from the log, at debug level, so that one failure is one line) and `fix`.

    A failure may also come as a RuntimeError: some bindings raise where the C++ call returns
    false (pyCore.cpp's PY_ASSERT_RUNTIME_ERROR) instead of answering False. Never pass a call
    bound with the GIL released that raises so (see set_profile): it ends the process."""
    logger = _tensorrt_logger
    held: list[tuple[str, str]] = []
    if logger is not None:
        logger.local.held = held
    raised = ""
    try:
        try:
            ok = bool(call())
        except RuntimeError as exc:
            ok, raised = False, str(exc).strip()
    finally:
        if logger is not None:
            logger.local.held = None
    if ok:
        if logger is not None:
            logger.release(held)  # errors of a call that worked anyway: logged as usual
        return
    said = [msg for _severity, msg in held] + ([raised] if raised else [])
    detail = f" ({'; '.join(said)})" if said else ""
    raise BackendUnavailable(f"TensorRT {what} failed{detail}: {fix}")


# How a context is bound to a profile, per release line. `set_optimization_profile_async` is
# bound with the GIL released on 8.5.2 to 10.12 (pyCore.cpp: `py::call_guard<
# py::gil_scoped_release>`), and its failure sets a Python error with no thread state: the
# process dies (SIGSEGV), there is no RuntimeError to catch. 10.13 dropped the GIL release, so
# from there the call raises (or answers False) like any other.
# - 8.x: the `active_optimization_profile` setter (the synchronous setOptimizationProfile, bound
#   without the GIL release) raises a RuntimeError on a refusal.
# - 10.0 to 10.12: that property is read-only (checked against 10.3's and 10.16's bindings), so
#   the async call stays, but only once what TensorRT would refuse has been checked here: a
#   profile the engine has, held by no other context of this process (plan_contexts; 10.x
#   shares profiles between contexts by default anyway).
# - 10.13 and later: the async call, checked.
ASYNC_PROFILE_RAISES_FROM = (10, 13)


def trt_version(trt: Any) -> tuple[int, ...]:
    """(8, 5, 2, 2) for '8.5.2.2'; a part without digits counts 0."""
    parts = []
    for p in str(getattr(trt, "__version__", "0")).split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def profile_by_setter(trt: Any) -> bool:
    """Whether this release binds profiles through the `active_optimization_profile` setter
    (8.x: the async call would end the process on a refusal, and the setter raises)."""
    if trt_version(trt) >= ASYNC_PROFILE_RAISES_FROM:
        return False
    prop = getattr(getattr(trt, "IExecutionContext", None), "active_optimization_profile", None)
    return isinstance(prop, property) and prop.fset is not None


def set_profile(trt: Any, context: Any, profile: int, stream_handle: int, profiles: int
                ) -> None:
    """Bind `context` to `profile` of an engine with `profiles` optimization profiles,
    checked (TensorRT refuses e.g. a profile already in use by another live context on 8.x),
    through a call whose refusal raises on this release (ASYNC_PROFILE_RAISES_FROM)."""
    what = f"binding an execution context to optimization profile {profile}"
    fix = ("on TensorRT 8.x a profile serves one execution context at a time: instances > 1 "
           "need an engine with a profile per bucket and instance, so set instances = 1, or "
           "rebuild with `stgcnd build --rebuild`")
    if not 0 <= profile < profiles:  # refused on every release: never asked
        raise BackendUnavailable(f"TensorRT {what} failed (the engine has {profiles} "
                                 f"profile(s)): {fix}")
    if profile_by_setter(trt):
        def call() -> bool:
            context.active_optimization_profile = profile
            return True
    else:
        call = functools.partial(context.set_optimization_profile_async, profile, stream_handle)
    checked_call(what, fix, call)


def set_addresses(context: Any, addresses: dict[str, int]) -> None:
    """Point each I/O tensor at its device buffer, checked: an address TensorRT refuses (a
    name the engine lacks, a misaligned buffer) would otherwise surface as a wrong result
    or a crash at the first batch."""
    for name, address in addresses.items():
        checked_call(f"setting the address of tensor {name!r}",
                     "rebuild the engine with `stgcnd build --backend tensorrt --rebuild` "
                     "(its I/O tensors are not the ones stgcnd builds)",
                     functools.partial(context.set_tensor_address, name, address))


def prepare_context(trt: Any, engine: Any, profile: int, stream: int, memory: int,
                    nbytes: int, addresses: dict[str, int]) -> Any:
    """An execution context on the caller's activation memory, bound to `profile`, its I/O
    tensors at `addresses`: in that order, each step checked."""
    context = context_without_memory(trt, engine)
    if context is None:
        raise BackendUnavailable("TensorRT could not create an execution context (see "
                                 "its error above; out of memory?)")
    give_memory(context, memory, nbytes)
    set_profile(trt, context, profile, stream,
                int(getattr(engine, "num_optimization_profiles", 1)))
    set_addresses(context, addresses)
    return context


def capture_graph(stream: int, work: Callable[[], object]) -> DriverGraph:
    """A CUDA graph of `work` on `stream`. A capture that cannot even begin (a failed
    cuStreamBeginCapture: the CudaError comes before `work` ran) disables graphs as any failed
    capture does, instead of dropping the runner: the runner computes without graphs."""
    began = False

    def tracked() -> object:
        nonlocal began
        began = True
        return work()

    try:
        return DriverGraph(stream).capture(tracked)
    except CudaError as exc:
        if began:
            raise
        raise GraphsUnavailable(f"the capture did not begin: {exc}") from exc


def name_results(text: str) -> str:
    """Each bare 'CUresult N' in `text` with the driver's name for it."""
    return re.sub(r"(?<!\()CUresult (\d+)", lambda m: error_name(int(m.group(1))), text)


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




# --- device memory: one activation buffer per runner (pure functions of the module) ----------

def activation_bytes(engine: Any, profiles: Sequence[int]) -> int:
    """Activation memory one context needs, for the largest of `profiles` (8.5: the engine's
    whole-engine figure; 10.x: per profile; 11.x only has the _v2 names)."""
    for name in ("get_device_memory_size_for_profile_v2", "get_device_memory_size_for_profile"):
        per_profile = getattr(engine, name, None)
        if per_profile is not None:
            return max(int(per_profile(p)) for p in profiles)
    for name in ("device_memory_size_v2", "device_memory_size"):
        if hasattr(engine, name):
            return int(getattr(engine, name))
    raise BackendUnavailable("this TensorRT reports no device memory size for an engine")


def context_without_memory(trt: Any, engine: Any) -> Any:
    """An execution context whose activation memory the caller provides (`give_memory`):
    10.x and 11.x take an allocation strategy, 8.x has its own factory."""
    strategy = getattr(trt, "ExecutionContextAllocationStrategy", None)
    if strategy is not None:
        return engine.create_execution_context(strategy.USER_MANAGED)
    return engine.create_execution_context_without_device_memory()


def give_memory(context: Any, address: int, nbytes: int) -> None:
    """Point a context at its activation memory (10.x+: set_device_memory; 8.x: the
    device_memory property)."""
    if hasattr(context, "set_device_memory"):
        context.set_device_memory(address, nbytes)
    else:
        context.device_memory = address


# --- the one TensorRT logger ------------------------------------------------------------------
#
# TensorRT keeps a single logger pointer per process: the logger of the first Builder or Runtime
# is used for everything after it (8.x warns when another one is passed), so a builder and a
# runtime with loggers of their own would route messages unpredictably. stgcnd makes exactly
# one, routes TensorRT's messages into the structured JSON log, and keeps recent errors so that
# a failed build or load can say why.

# TensorRT severity name -> structlog method. VERBOSE is dropped (thousands of lines per build)
# and INFO goes to debug: both are for `--log-level debug` sessions, not the journal.
TENSORRT_SEVERITY_LEVELS = {"INTERNAL_ERROR": "critical", "ERROR": "error",
                            "WARNING": "warning", "INFO": "debug", "VERBOSE": None}
_tensorrt_logger: Any = None
_tensorrt_logger_lock = threading.Lock()


def severity_name(severity: Any) -> str:
    """'ERROR' for trt.ILogger.Severity.ERROR (pybind11 enums have .name; str() otherwise)."""
    return str(getattr(severity, "name", str(severity).rsplit(".", 1)[-1]))


def tensorrt_logger(trt: Any) -> Any:
    """The process's one TensorRT ILogger, created on first use (thread-safe)."""
    global _tensorrt_logger
    with _tensorrt_logger_lock:
        if _tensorrt_logger is None:
            _tensorrt_logger = _make_tensorrt_logger(trt)
        return _tensorrt_logger


def _make_tensorrt_logger(trt: Any) -> Any:
    trt_log = get_logger("stgcnd.tensorrt")

    class StructuredTensorRTLogger(trt.ILogger):
        """Routes TensorRT messages to stgcnd's log as `tensorrt_log` events."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: collections.deque[str] = collections.deque(maxlen=64)
            self.error_count = 0  # monotonic: callers take a mark, then errors_since(mark)
            # local.held: a list while this thread is in checked_call, whose error carries
            # TensorRT's errors instead of a line each (TensorRT logs on the calling thread).
            self.local = threading.local()

        def log(self, severity: Any, msg: str) -> None:
            name = severity_name(severity)
            level = TENSORRT_SEVERITY_LEVELS.get(name, "info")
            if level in ("critical", "error"):
                self.errors.append(msg)
                self.error_count += 1
                held = getattr(self.local, "held", None)
                if held is not None:
                    held.append((name, msg))
                    level = "debug"
            if level is not None:
                getattr(trt_log, level)("tensorrt_log", severity=name.lower(), message=msg)

        def release(self, held: list[tuple[str, str]]) -> None:
            """Log errors held for a call that worked after all, as they would have been."""
            for name, msg in held:
                getattr(trt_log, TENSORRT_SEVERITY_LEVELS[name] or "error")(
                    "tensorrt_log", severity=name.lower(), message=msg)

        def errors_since(self, mark: int) -> list[str]:
            """Errors logged after `mark` (an earlier `error_count`), oldest first."""
            n = min(self.error_count - mark, len(self.errors))
            return list(self.errors)[len(self.errors) - n:] if n > 0 else []

    return StructuredTensorRTLogger()


class TensorRTRuntime(Runtime):
    def __init__(self, engine_path: Path, input_shape: tuple[int, ...], num_class: int,
                 max_batch: int = 1, precision: str = "fp32", cuda_graph: bool = False) -> None:
        trt = import_tensorrt()
        missing = missing_api(trt)
        if missing:
            raise BackendUnavailable(f"TensorRT {version_of(trt)} lacks {', '.join(missing)}; "
                                     "stgcnd needs TensorRT 8.5 or newer (name-based tensor API)")
        engine_path = Path(engine_path)
        if not engine_path.is_file():
            raise UserError(f"TensorRT engine {engine_path} not found; build it with "
                            "`stgcnd build --backend tensorrt`")
        data = engine_path.read_bytes()
        make_current()  # the primary context is current before TensorRT touches CUDA
        self.runtime = trt.Runtime(tensorrt_logger(trt))
        loaded: list[Any] = []

        def deserialize() -> bool:
            loaded.append(self.runtime.deserialize_cuda_engine(data))
            return loaded[0] is not None

        try:  # TensorRT's reasons (a version or device mismatch) in the one error line
            checked_call(f"{version_of(trt)} loading {engine_path}",
                         "engines only run on the TensorRT version and GPU they were built "
                         "with; rebuild with `stgcnd build --backend tensorrt`", deserialize)
        except BackendUnavailable as exc:
            raise UserError(str(exc)) from None
        self.engine = loaded[0]
        self.trt = trt
        self.io = engine_io(trt, self.engine, max_batch)
        inputs = [t for t in self.io if t.is_input]
        if len(inputs) != 1:
            raise UserError(f"{engine_path} has {len(inputs)} inputs; expected one window input")
        self.input = inputs[0]
        self.classes = next((t.shape[-1] for t in self.io if not t.is_input and t.shape[-1] > 0),
                            None)  # the engine's output binding: its own class count
        self.dynamic = any(d < 0 for d in self.input.shape)
        self.profile_ranges = (profile_batch_ranges(self.engine, self.input.name)
                               if self.dynamic else [(1, 1, 1)])
        self.cuda_graph = cuda_graph
        # Set once, by the first runner whose capture fails: from then on no one in this
        # process captures again (a failure is logged once).
        self.graph_failure: str | None = None
        self._lock = threading.Lock()
        self.profiles_in_use: set[int] = set()  # by this engine's runners (instances)
        self.info = RuntimeInfo(
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

    def _open_runner(self, buckets: Sequence[int], lanes: int) -> Runner:
        return TrtRunner(self, buckets, lanes)

    def claim_profiles(self, buckets: Sequence[int]) -> ContextPlan:
        """A runner's contexts on profiles no other runner of this engine holds."""
        with self._lock:
            plan = plan_contexts(buckets, self.profile_ranges, self.dynamic,
                                 frozenset(self.profiles_in_use))
            self.profiles_in_use |= set(plan.profiles.values())
        return plan

    def release_profiles(self, plan: ContextPlan) -> None:
        with self._lock:
            self.profiles_in_use -= set(plan.profiles.values())

    def runner_bytes(self, buckets: Sequence[int]) -> int:
        """Device bytes of one runner: its shared activation buffer (TensorRT's own figure
        for the profiles its buckets map to) and its input and output rows."""
        with self._lock:
            plan = plan_contexts(normalize_buckets(buckets, self.info.max_batch),
                                 self.profile_ranges, self.dynamic,
                                 frozenset(self.profiles_in_use))
        rows = max(plan.buckets)
        io = sum(int(np.prod(t.max_shape[1:], dtype=np.int64)) * t.dtype.itemsize
                 for t in self.io) * rows
        return activation_bytes(self.engine, sorted(set(plan.profiles.values()))) + io

    def graphs_failed(self, what: str, error: str) -> None:
        error = name_results(error)
        with self._lock:
            first = self.graph_failure is None
            self.graph_failure = self.graph_failure or error
        if first:
            log.warning("cuda_graphs_disabled", backend="tensorrt", what=what, error=error,
                        action="computing every bucket on a worker thread, without graphs")

    def new_context(self, profile: int, stream: int, memory: int, nbytes: int,
                    addresses: dict[str, int]) -> Any:
        """A context on the runner's activation memory, bound to `profile` (always set and
        checked: TensorRT 8.x starts only an engine's first context on profile 0)."""
        return prepare_context(self.trt, self.engine, profile, stream, memory, nbytes,
                               addresses)

    def close(self) -> None:
        make_current()
        self.engine = None
        self.runtime = None


# A runner (`TrtRunner`) makes one execution context per batch bucket, each on its own
# optimization profile when the engine has one per bucket (stgcnd builds them so; TensorRT 8.x
# lets a profile serve one context at a time), and one lane (a stream and two events) per
# client. Its contexts share one activation buffer (`activation_bytes`): they run one batch at
# a time on the runner's stream, and TensorRT would otherwise give each context the memory of
# the largest profile (docs/performance.md). With CUDA graphs (one per bucket) a launch only
# enqueues and the I/O loop polls it; without, it computes on its worker.
#
# Every context gets its activation memory, then its profile (`set_profile`: the call per release
# whose refusal raises; whether 8.5 takes a profile before the memory is unknown, so the memory
# comes first), then its
# tensor addresses, each checked: on 8.x only the first context of an engine starts on profile
# 0, the others have none until told. A failed TensorRT call is one error line that carries
# TensorRT's own messages (`checked_call`), not a line from TensorRT and another from stgcnd.
class TrtRunner(Runner):
    """The batched executor's TensorRT resources (see base.Runner).

    A batch (`cuda_batch.LanedBatch`, shared with the torch runner): the windows are staged
    into the runner's pinned rows, each uploaded on its client's stream (lane) into its slot
    of the shared device input; the compute stream waits on every upload, launches the
    bucket's CUDA graph (or enqueues its context), and each lane's stream waits for the
    compute and downloads its logits row. Only the compute step is TensorRT's; the rest runs
    on every GPU test machine through torch.

    With a graph per bucket (captured here, before READY) a launch only enqueues: the I/O loop
    drives the runner. Without graphs (none allowed, or a capture failed) it is `blocking`:
    `execute_async_v3` enqueues every kernel from Python, so its worker thread does that.
    """

    def __init__(self, runtime: TensorRTRuntime, buckets: Sequence[int], lanes: int) -> None:
        super().__init__(runtime.info, buckets, lanes)
        self.runtime = runtime
        self.plan = runtime.claim_profiles(self.buckets)
        self.buckets = self.plan.buckets
        self.input = runtime.input
        self.output = next(t for t in runtime.io if not t.is_input)
        self.contexts: dict[int, Any] = {}
        self.graphs: dict[int, DriverGraph] = {}
        self._shape: dict[int, int] = {}          # id(context) -> batch its shape is set to
        rows = self.max_batch
        make_current()
        self.memory = memory = DriverMemory()
        try:
            self.compute = memory.stream()
            self.dev_in = memory.device_zeros(rows * self._row_bytes(self.input), self.compute)
            self.dev_out = memory.device_zeros(rows * self._row_bytes(self.output),
                                               self.compute)
            others = [t for t in runtime.io if not t.is_input and t is not self.output]
            self.dev_other = {t.name: memory.device_zeros(
                int(np.prod(t.max_shape)) * t.dtype.itemsize, self.compute) for t in others}
            # One activation buffer for every context: they run one at a time on `compute`.
            self.activation_bytes = activation_bytes(runtime.engine,
                                                     sorted(set(self.plan.profiles.values())))
            activations = memory.device_zeros(self.activation_bytes, self.compute)
            shared = None
            for b in self.buckets:
                if shared is None or self.plan.per_bucket:
                    shared = runtime.new_context(self.plan.profiles[b], self.compute,
                                                 activations, self.activation_bytes,
                                                 self._addresses())
                    if self.plan.per_bucket:
                        self._set_shape(shared, b)
                self.contexts[b] = shared
            self.lane_streams = [memory.stream() for _ in range(self.lanes)]
            # Pinned rows per batch slot, not per client: max_batch windows, whatever the
            # number of cameras.
            self.host_in = memory.pinned((rows, *self.input.max_shape[1:]), self.input.dtype)
            self.host_out = memory.pinned((rows, *self.output.max_shape[1:]),
                                          self.output.dtype)
            self.batch = LanedBatch(self.host_in, self.host_out, self.dev_in, self.compute,
                                    self.lane_streams)
            self._capture_graphs()
        except BaseException:
            # Whatever was made, in the order close() frees it: graphs, contexts, events.
            for graph in self.graphs.values():
                graph.destroy()
            self.graphs.clear()
            self.contexts.clear()
            if getattr(self, "batch", None) is not None:
                self.batch.destroy()
            memory.free()
            runtime.release_profiles(self.plan)
            raise
        self.blocking = not self.graphs
        log.info("tensorrt_runner_ready", buckets=list(self.buckets),
                 contexts=len({id(c) for c in self.contexts.values()}),
                 per_bucket_profiles=self.plan.per_bucket, lanes=self.lanes,
                 activation_mb=round(self.activation_bytes / 2**20, 1),
                 cuda_graph=bool(self.graphs))

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

    def _capture_graphs(self) -> None:
        """One CUDA graph per bucket, when asked and allowed. A failed capture is not fatal:
        logged once, and the runner computes without graphs."""
        runtime = self.runtime
        if (not runtime.cuda_graph or runtime.graph_failure is not None
                or not graphs_allowed(self.plan)):
            return
        try:
            for b in self.buckets:
                self._set_shape(self.contexts[b], b)
                self._enqueue(b)  # a bucket's first enqueue does deferred set-up, uncaptured
                self.memory.synchronize(self.compute)
                with CAPTURE_LOCK:
                    self.graphs[b] = capture_graph(self.compute,
                                                   functools.partial(self._enqueue, b))
        except GraphsUnavailable as exc:
            runtime.graphs_failed(f"bucket {b}", str(exc))
            for graph in self.graphs.values():
                graph.destroy()
            self.graphs.clear()

    def attach(self) -> None:
        make_current()
        if not self.blocking:
            self.batch.poll_only()  # the loop only queries

    def _launch(self, windows: Sequence[np.ndarray], lanes: Sequence[int], bucket: int
                ) -> None:
        batch = self.batch
        batch.stage(windows)
        bad = first_failure(batch.upload(lanes), batch.start())
        graph = self.graphs.get(bucket)
        if graph is not None and batch.ops.launch_graph is not None:
            bad = first_failure(bad, batch.ops.launch_graph(graph.exec_handle,
                                                           batch.compute_stream))
        else:
            self._set_shape(self.contexts[bucket], bucket)
            self._enqueue(bucket)
        batch.finish(self.dev_out, lanes, bad)

    def done(self) -> bool:
        return self.batch.done()

    def wait(self) -> None:
        self.batch.wait()

    def _collect(self) -> np.ndarray:
        logits, compute_ms = self.batch.collect()
        self.last_timings = {"compute_ms": compute_ms}
        return logits

    def close(self) -> None:
        """Free everything, from any thread (the context is made current there); idempotent."""
        if not self.contexts:
            return
        make_current()
        self.memory.synchronize(self.compute)
        for graph in self.graphs.values():
            graph.destroy()
        self.graphs.clear()
        self.contexts.clear()  # execution contexts before the memory they address
        self._shape.clear()
        self.batch.destroy()
        self.memory.free()
        self.dev_other.clear()
        self.lane_streams = []
        self.runtime.release_profiles(self.plan)
