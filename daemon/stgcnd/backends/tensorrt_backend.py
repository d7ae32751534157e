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
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd import runtimes
from stgcnd.backends.base import Backend, BackendInfo, Session
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
    "TensorIOMode": ("INPUT", "OUTPUT"),
    "DataType": ("FLOAT", "HALF", "INT8", "INT32", "BOOL"),
}

# I/O data types by enum *name*: INT64 and BF16 appear in 10.x, FP4/E8M0 in 11.x; a name the
# running release lacks simply never occurs.
_NUMPY_BY_TRT_NAME = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8,
                      "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_, "UINT8": np.uint8}

_trt_logger: Any = None
_logger_lock = threading.Lock()


def import_tensorrt() -> Any:
    """The `tensorrt` module, checked for the name-based tensor API this backend uses."""
    trt = runtimes.import_tensorrt()
    missing = missing_api(trt)
    if missing:
        raise BackendUnavailable(f"TensorRT {version_of(trt)} lacks {', '.join(missing)}; stgcnd "
                                 "needs TensorRT 8.5 or newer (name-based tensor API)")
    return trt


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
    """One TensorRT logger per process (several loggers make 8.x warn on every runtime)."""
    global _trt_logger
    with _logger_lock:
        if _trt_logger is None:
            _trt_logger = trt.Logger(trt.Logger.WARNING)
        return _trt_logger


@dataclass(frozen=True)
class TensorIO:
    name: str
    is_input: bool
    dtype: np.dtype
    shape: tuple[int, ...]        # as built; -1 for a dynamic dimension
    max_shape: tuple[int, ...]    # the largest shape the session allocates


def engine_io(trt: Any, engine: Any, max_batch: int) -> list[TensorIO]:
    """The engine's I/O tensors; dynamic batch dimensions bounded by profile 0 and max_batch."""
    tensors = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        if is_input and any(d < 0 for d in shape):
            prof_max = tuple(int(d) for d in engine.get_tensor_profile_shape(name, 0)[2])
            max_shape = (min(prof_max[0], max_batch), *prof_max[1:])
        else:
            max_shape = tuple(max_batch if d < 0 else d for d in shape)
        tensors.append(TensorIO(name, is_input, numpy_dtype(engine.get_tensor_dtype(name)),
                                shape, max_shape))
    return tensors


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
        self.cuda_graph = cuda_graph
        self.info = BackendInfo(
            name="tensorrt", precision=precision, device="cuda:0",
            input_shape=tuple(input_shape), num_class=int(num_class),
            max_batch=int(inputs[0].max_shape[0]), artifact=str(engine_path),
            details={"tensorrt": version_of(trt), "cuda_graph": cuda_graph,
                     "io": {t.name: {"dtype": t.dtype.name, "shape": list(t.shape)}
                            for t in self.io}})
        log.info("backend_loaded", backend="tensorrt", precision=precision,
                 path=str(engine_path), tensorrt=version_of(trt), cuda_graph=cuda_graph)

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

    def close(self) -> None:
        from stgcnd.backends.cuda import pycuda_current

        with pycuda_current():
            self.engine = None
            self.runtime = None


class _TrtSession(Session):
    backend: TensorRTBackend

    def __init__(self, backend: TensorRTBackend) -> None:
        super().__init__(backend)
        import pycuda.driver as cuda

        from stgcnd.backends.cuda import pycuda_current

        self.cuda = cuda
        self.graphs: dict[int, Any] = {}
        self.host: dict[str, np.ndarray] = {}
        self.device: dict[str, Any] = {}
        with pycuda_current():
            self.stream = cuda.Stream()
            self.events = [cuda.Event() for _ in range(4)]
            self.context = backend.engine.create_execution_context()
            if self.context is None:
                raise BackendUnavailable("TensorRT could not create an execution context (GPU "
                                         "memory exhausted?); close idle sessions")
            if backend.engine.num_optimization_profiles > 1:
                self.context.set_optimization_profile_async(0, self.stream.handle)
            for t in backend.io:
                self.host[t.name] = cuda.pagelocked_empty(t.max_shape, t.dtype)
                self.device[t.name] = cuda.mem_alloc(max(self.host[t.name].nbytes, 1))
                self.context.set_tensor_address(t.name, int(self.device[t.name]))
        self.input = next(t for t in backend.io if t.is_input)
        self.outputs = [t for t in backend.io if not t.is_input]
        self._batch = -1

    def _set_batch(self, b: int) -> None:
        if b == self._batch:
            return
        dynamic = any(d < 0 for d in self.input.shape)
        if dynamic and not self.context.set_input_shape(self.input.name,
                                                        (b, *self.input.shape[1:])):
            raise UserError(f"the engine does not accept batch {b}")
        self._batch = b

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self.stream.handle):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")

    def _infer(self, batch: np.ndarray) -> np.ndarray:
        from stgcnd.backends.cuda import DriverGraph, pycuda_current

        cuda, ev = self.cuda, self.events
        t0 = time.perf_counter()
        b = batch.shape[0]
        with pycuda_current():
            self._set_batch(b)
            host_in = self.host[self.input.name][:b]
            np.copyto(host_in, batch, casting="same_kind")
            if self.backend.cuda_graph and b not in self.graphs:
                self._enqueue()  # the first enqueue after a shape change does deferred setup
                self.stream.synchronize()
                self.graphs[b] = DriverGraph(self.stream.handle).capture(self._enqueue)
            ev[0].record(self.stream)
            cuda.memcpy_htod_async(self.device[self.input.name], host_in, self.stream)
            ev[1].record(self.stream)
            if self.backend.cuda_graph:
                self.graphs[b].launch()
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
        from stgcnd.backends.cuda import pycuda_current

        with pycuda_current():
            self.stream.synchronize()
            for g in self.graphs.values():
                g.destroy()
            self.graphs.clear()
            self.context = None
            for mem in self.device.values():
                mem.free()
            self.device.clear()
            self.host.clear()  # page-locked memory is unpinned when the arrays are collected
            self.events = []
            self.stream = None
