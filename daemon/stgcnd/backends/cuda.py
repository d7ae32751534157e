"""The process's one CUDA context, and CUDA graphs without torch.

Everything CUDA in the daemon runs on the device's *primary* context: torch uses it, and
pycuda joins it through `pycuda.autoprimaryctx` (never `pycuda.autoinit`, which creates a second
context: memory and streams could then not be shared with torch, and each context costs
hundreds of MB on a Jetson). `init_cuda` is called once, in the main thread, before any worker.

pycuda has no stream-capture API, so the TensorRT backend's CUDA graphs use the driver API
(libcuda, present wherever pycuda works) through ctypes: `DriverGraph`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from typing import Any, Literal

from stgcnd.errors import BackendUnavailable
from stgcnd.log import get_logger

log = get_logger(__name__)

CudaKind = Literal["torch", "pycuda"]

_lock = threading.Lock()
_pycuda_context: Any = None


def init_cuda(kind: CudaKind) -> Any:
    """Create or retain the primary context; returns it (pycuda Context) or the torch device."""
    global _pycuda_context
    with _lock:
        if kind == "torch":
            import torch

            if not torch.cuda.is_available():
                raise BackendUnavailable("CUDA is not available to torch; use --device cpu, or "
                                         "install a CUDA build of torch and check the driver")
            torch.cuda.init()
            return torch.device("cuda", torch.cuda.current_device())
        if kind != "pycuda":
            raise ValueError(f"unknown CUDA kind {kind!r}")
        if _pycuda_context is None:
            try:
                import pycuda.autoprimaryctx as primary  # retains and pushes the primary context
            except ImportError:
                raise BackendUnavailable("pycuda is not installed; on a Jetson install it into "
                                         "the venv (pip install pycuda) next to JetPack's "
                                         "tensorrt") from None
            except Exception as exc:  # pycuda raises its own LogicError/RuntimeError types
                raise BackendUnavailable(f"cannot initialise CUDA through pycuda: {exc}; check "
                                         "the driver with nvidia-smi / tegrastats") from None
            _pycuda_context = primary.context
            log.info("cuda_primary_context", via="pycuda",
                     device=primary.device.name())
        return _pycuda_context


@contextlib.contextmanager
def pycuda_current() -> Iterator[Any]:
    """Make the primary context current in this thread for the block (workers need it)."""
    import pycuda.driver as cuda

    ctx = init_cuda("pycuda")
    try:
        current = cuda.Context.get_current()
    except Exception:
        current = None
    if current is not None:
        yield ctx
        return
    ctx.push()
    try:
        yield ctx
    finally:
        cuda.Context.pop()


# --- CUDA graphs through the driver API (torch-free) -----------------------------------------

_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
_libcuda: Any = None


def _driver() -> Any:
    global _libcuda
    if _libcuda is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise BackendUnavailable(f"libcuda.so.1 not found ({exc}); CUDA graphs need the "
                                     "NVIDIA driver") from None
        for name in ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
                     "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy"):
            getattr(lib, name).restype = ctypes.c_int
        _libcuda = lib
    return _libcuda


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with CUresult {status}")


class DriverGraph:
    """One captured sequence of work on a stream, replayed with a single launch.

    Capture is thread-local, so other sessions keep running on their streams meanwhile.
    """

    def __init__(self, stream_handle: int) -> None:
        self.stream = ctypes.c_void_p(stream_handle)
        self._graph = ctypes.c_void_p()
        self._exec = ctypes.c_void_p()

    def capture(self, work: Any) -> DriverGraph:
        lib = _driver()
        _check(lib.cuStreamBeginCapture_v2(self.stream, _CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               "cuStreamBeginCapture")
        try:
            work()
        finally:
            status = lib.cuStreamEndCapture(self.stream, ctypes.byref(self._graph))
        _check(status, "cuStreamEndCapture")
        _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph,
                                               ctypes.c_ulonglong(0)),
               "cuGraphInstantiateWithFlags")
        return self

    def launch(self) -> None:
        _check(_driver().cuGraphLaunch(self._exec, self.stream), "cuGraphLaunch")

    def destroy(self) -> None:
        lib = _libcuda
        if lib is None:
            return
        if self._exec:
            lib.cuGraphExecDestroy(self._exec)
            self._exec = ctypes.c_void_p()
        if self._graph:
            lib.cuGraphDestroy(self._graph)
            self._graph = ctypes.c_void_p()
