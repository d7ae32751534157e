"""The process's one CUDA context, and CUDA graphs without torch.

Everything CUDA in the daemon runs on the device's *primary* context: torch uses it, and
pycuda retains it (`Device.retain_primary_context`; never `pycuda.autoinit`, which creates a
second context: memory and streams could then not be shared with torch, and each context costs
hundreds of MB on a Jetson) and makes it current per block with `pycuda_current`, in whichever
thread the block runs (the main thread, the reload thread, an executor). pycuda objects
(streams, events, device and pinned memory) are freed explicitly in the thread that owns them,
inside `pycuda_current`, never left to the garbage collector of another thread; what one
thread makes and another frees (a batch runner the I/O loop drives) comes from the driver
instead: `DriverMemory`.

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
# One stream capture at a time in the process: beginning a capture while another thread's
# stream is capturing can invalidate it (a synchronizing call during capture is an error).
CAPTURE_LOCK = threading.Lock()
# One runner prepared at a time in the process: a runner's set-up (pinned and device buffers,
# library handles, warm-up runs) is not legal while another thread captures a graph. Two
# executors preparing at once failed on the H100 with "operation not permitted when stream is
# capturing". Serving runners never take this lock, so a reload's preparation never stalls
# them: they only replay, which CAPTURE_LOCK orders against captures.
PREPARE_LOCK = threading.Lock()


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
            _pycuda_context = _retain_primary_context()
        return _pycuda_context


def _retain_primary_context() -> Any:
    """Retain (not push) the primary context through pycuda.

    Not `pycuda.autoprimaryctx`: it pushes the context in whichever thread imports it first
    (the reload thread, when the first TensorRT model arrives by SIGHUP) and pops it at exit
    from the main thread. A retained context made current per block (`pycuda_current`) works
    the same from every thread.
    """
    try:
        import pycuda.driver as cuda
    except ImportError:
        raise BackendUnavailable("pycuda is not installed; on a Jetson build it into the venv "
                                 "(see docs/jetson.md: pip install pycuda with nvcc on PATH) "
                                 "next to JetPack's tensorrt") from None
    try:
        cuda.init()
        device = cuda.Device(0)
        context = device.retain_primary_context()
    except Exception as exc:  # pycuda raises its own LogicError/RuntimeError types
        raise BackendUnavailable(f"cannot initialise CUDA through pycuda: {exc}; check "
                                 "the driver with nvidia-smi / tegrastats") from None
    log.info("cuda_primary_context", via="pycuda", device=device.name())
    return context


@contextlib.contextmanager
def pycuda_current() -> Iterator[Any]:
    """Make the primary context current in this thread for the block (workers need it)."""
    ctx = init_cuda("pycuda")
    if _has_current_context():
        yield ctx
        return
    ctx.push()
    try:
        yield ctx
    finally:
        _pop_context()


def _has_current_context() -> bool:
    import pycuda.driver as cuda

    try:
        return cuda.Context.get_current() is not None
    except Exception:
        return False


def _pop_context() -> None:
    import pycuda.driver as cuda

    cuda.Context.pop()


_held = threading.local()  # per thread: [runners holding the context, whether we pushed it]


def hold_current() -> None:
    """Make the primary context current in the calling thread until as many
    `release_current` calls: the I/O loop's thread, which drives runners other threads made.

    Counted per thread, so that one runner closing (a reload retiring its model) leaves the
    context current for the others. Pushed only when no context is current (torch's runtime
    calls may have made the same primary context current already), and popped by the last
    release: pycuda aborts the process when a thread or the interpreter ends with a context
    it pushed still on its stack."""
    ctx = init_cuda("pycuda")
    state = getattr(_held, "state", None)
    if state is None:
        pushed = not _has_current_context()
        if pushed:
            ctx.push()
        state = _held.state = [0, pushed]
    state[0] += 1


def release_current() -> None:
    """Undo one `hold_current` of the calling thread."""
    state = getattr(_held, "state", None)
    if state is None:
        return
    state[0] -= 1
    if state[0] <= 0:
        _held.state = None
        if state[1]:
            _pop_context()


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
        """Capture `work()` (which enqueues on the stream) and instantiate it; raises on failure
        after cleaning up (the stream leaves capture mode, the partial graph is destroyed)."""
        lib = _driver()
        _check(lib.cuStreamBeginCapture_v2(self.stream, _CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               "cuStreamBeginCapture")
        failure: BaseException | None = None
        try:
            if work() is False:  # e.g. execute_async_v3 refusing to enqueue while capturing
                failure = RuntimeError("the captured work reported failure")
        except Exception as exc:
            failure = exc
        # Always end the capture, even after a failure: a stream left capturing would make
        # every later enqueue on it fail. The partial graph (if any) is destroyed.
        status = lib.cuStreamEndCapture(self.stream, ctypes.byref(self._graph))
        try:
            if failure is not None:
                raise RuntimeError(f"CUDA graph capture failed: {failure}") from failure
            _check(status, "cuStreamEndCapture")
            _check(lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph,
                                                   ctypes.c_ulonglong(0)),
                   "cuGraphInstantiateWithFlags")
        except BaseException:
            self.destroy()
            raise
        return self

    def try_capture(self, work: Any, what: str) -> bool:
        """capture(), but a failure is not fatal: as trtexec does, the capture is ended, the
        partial graph destroyed, the failure logged (`cuda_graph_capture_failed`) and False
        returned, so that the caller runs without a graph from then on."""
        try:
            self.capture(work)
        except Exception as exc:
            log.warning("cuda_graph_capture_failed", what=what, error=str(exc),
                        action="running without a CUDA graph")
            return False
        return True

    def launch(self) -> None:
        _check(_driver().cuGraphLaunch(self._exec, self.stream), "cuGraphLaunch")

    @property
    def exec_handle(self) -> int:
        """The instantiated graph (CUgraphExec), for `DriverCalls.launch_graph`."""
        return int(self._exec.value or 0)

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


# --- a batch's host-side work as plain driver calls -------------------------------------------

CU_EVENT_DEFAULT = 0x0          # timing enabled
CU_EVENT_BLOCKING_SYNC = 0x1    # cuEventSynchronize sleeps instead of spinning a core
CU_EVENT_DISABLE_TIMING = 0x2
CUDA_ERROR_NOT_READY = 600


class DriverCalls:
    """A batch's host-side work as plain driver calls: copies, events, the graph launch.

    A batch moves each window up and its logits down on the window's client stream (a lane),
    ordered against the batch's compute stream by events: seven calls per window. Around them
    a batch records its start, compute end and done events and launches its bucket's graph.
    Through torch (`torch.cuda.stream`, `copy_`, `Event.record`, `CUDAGraph.replay`,
    `Event.query`) each of these costs several microseconds of Python and dispatcher work, and
    the I/O loop pays it for every batch; a ctypes call into libcuda costs about a microsecond.
    So these take raw addresses and stream, event and graph handles prepared once at start-up.

    The calls run in the calling thread's current context: the thread that made the runner,
    or the I/O loop after `attach`, where torch (runtime API) has made the device's primary
    context current. Every call returns a CUresult; the hot path or's them together and
    `check` raises once.
    """

    def __init__(self, events: int) -> None:
        # PyDLL, not CDLL: these calls only enqueue work or read a flag and return in about a
        # microsecond, so they keep the GIL. A CDLL call releases and re-takes it every time,
        # and with the I/O loop busy each re-take waited for the loop's switch interval (the
        # H100 profile). The one call that blocks, cuEventSynchronize, goes through CDLL.
        try:
            lib = ctypes.PyDLL("libcuda.so.1")
            blocking = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise BackendUnavailable(f"libcuda.so.1 not found ({exc}); the CUDA runner needs "
                                     "the NVIDIA driver") from None
        ptr, size, uint = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint
        dev = ctypes.c_uint64  # CUdeviceptr
        self.htod = _bind(lib, "cuMemcpyHtoDAsync_v2", dev, ptr, size, ptr)
        self.dtoh = _bind(lib, "cuMemcpyDtoHAsync_v2", ptr, dev, size, ptr)
        self.record = _bind(lib, "cuEventRecord", ptr, ptr)
        self.wait = _bind(lib, "cuStreamWaitEvent", ptr, ptr, uint)
        self.launch_graph = _bind(lib, "cuGraphLaunch", ptr, ptr)
        self.query = _bind(lib, "cuEventQuery", ptr)
        self.synchronize = _bind(blocking, "cuEventSynchronize", ptr)
        # The _v2 entry point (CUDA 12.8+) where the driver has it, else the original.
        elapsed = "cuEventElapsedTime_v2" if hasattr(lib, "cuEventElapsedTime_v2") else \
            "cuEventElapsedTime"
        self._elapsed = _bind(lib, elapsed, ctypes.POINTER(ctypes.c_float), ptr, ptr)
        self._ms = ctypes.c_float()
        self._ms_ref = ctypes.byref(self._ms)
        self._create = _bind(lib, "cuEventCreate", ctypes.POINTER(ptr), uint)
        self._destroy = _bind(lib, "cuEventDestroy_v2", ptr)
        self.events: list[int] = []
        try:
            for _ in range(events):
                self.event(CU_EVENT_DISABLE_TIMING)
        except BaseException:
            self.destroy()
            raise

    def event(self, flags: int) -> int:
        """A new event (CU_EVENT_* flags), destroyed with the others by `destroy`."""
        handle = ctypes.c_void_p()
        _check(self._create(ctypes.byref(handle), flags), "cuEventCreate")
        self.events.append(int(handle.value or 0))
        return self.events[-1]

    def release(self, handle: int) -> None:
        """Destroy one event now (one replaced before the others are done with)."""
        self.events.remove(handle)
        self._destroy(handle)

    def is_done(self, event: int) -> bool:
        """Whether everything before the event's record has finished (never blocks)."""
        status = self.query(event)
        if status == CUDA_ERROR_NOT_READY:
            return False
        self.check(status, "cuEventQuery")
        return True

    def elapsed_ms(self, start: int, end: int) -> float:
        """Device time between two completed timing events, in milliseconds."""
        self.check(self._elapsed(self._ms_ref, start, end), "cuEventElapsedTime")
        return float(self._ms.value)

    @staticmethod
    def check(status: int, what: str) -> None:
        if status:
            # "CUDA error" marks it fatal for the executor: the context may be unusable.
            raise RuntimeError(f"CUDA error: {what} failed with CUresult {status}")

    def destroy(self) -> None:
        for handle in self.events:
            self._destroy(handle)
        self.events = []


CU_STREAM_NON_BLOCKING = 0x1  # no implicit ordering against the legacy default stream


class DriverMemory:
    """Streams, device memory and page-locked host memory of one runner, made and freed
    through the driver.

    Not pycuda's objects: pycuda ties each one to the thread whose context stack it was made
    under, and a Stream or pagelocked array freed from another thread is not freed at all
    (pycuda warns "... in out-of-thread context could not be cleaned up" and leaks it). A
    runner is prepared in one thread (the main thread, or the reload thread on SIGHUP) and,
    when the I/O loop drives it, closed in another: with pycuda objects every reload that
    replaced a loop-driven TensorRT model leaked its streams and pinned rows. Driver handles
    belong to the context, not to a thread, so `free` works from any thread where the
    primary context is current.

    Allocation is start-up work (CDLL: the calls release the GIL); nothing here is on a
    request's path.
    """

    def __init__(self) -> None:
        lib = _driver()
        ptr, size, uint, dev = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_uint64
        self._stream_create = _bind(lib, "cuStreamCreate", ctypes.POINTER(ptr), uint)
        self._stream_destroy = _bind(lib, "cuStreamDestroy_v2", ptr)
        self._stream_sync = _bind(lib, "cuStreamSynchronize", ptr)
        self._alloc = _bind(lib, "cuMemAlloc_v2", ctypes.POINTER(dev), size)
        self._free = _bind(lib, "cuMemFree_v2", dev)
        self._memset = _bind(lib, "cuMemsetD8Async", dev, ctypes.c_ubyte, size, ptr)
        self._host_alloc = _bind(lib, "cuMemHostAlloc", ctypes.POINTER(ptr), size, uint)
        self._host_free = _bind(lib, "cuMemFreeHost", ptr)
        self.streams: list[int] = []
        self.device: list[int] = []
        self.host: list[int] = []

    def stream(self) -> int:
        """A new non-blocking stream (CUstream handle)."""
        handle = ctypes.c_void_p()
        _check(self._stream_create(ctypes.byref(handle), CU_STREAM_NON_BLOCKING),
               "cuStreamCreate")
        self.streams.append(int(handle.value or 0))
        return self.streams[-1]

    def device_zeros(self, nbytes: int, stream: int) -> int:
        """`nbytes` of device memory (at least 1), zeroed on `stream` (synchronized here):
        padding rows of a batch are never read back, but start at zero, not at garbage."""
        nbytes = max(int(nbytes), 1)
        address = ctypes.c_uint64()
        _check(self._alloc(ctypes.byref(address), nbytes), "cuMemAlloc")
        self.device.append(int(address.value))
        _check(self._memset(address.value, 0, nbytes, stream), "cuMemsetD8Async")
        self.synchronize(stream)
        return self.device[-1]

    def pinned(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A page-locked numpy array, valid until `free`."""
        import numpy as np

        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = max(count * dtype.itemsize, 1)
        address = ctypes.c_void_p()
        _check(self._host_alloc(ctypes.byref(address), nbytes, 0), "cuMemHostAlloc")
        self.host.append(int(address.value or 0))
        raw = (ctypes.c_ubyte * nbytes).from_address(self.host[-1])
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)

    def synchronize(self, stream: int) -> None:
        _check(self._stream_sync(stream), "cuStreamSynchronize")

    def synchronize_all(self) -> None:
        """Wait for the work on every stream made here."""
        for handle in self.streams:
            self.synchronize(handle)

    def free(self) -> None:
        """Free everything once its streams are done; idempotent. Arrays from `pinned` must
        not be used afterwards. Keeps going past a failed call, then raises."""
        failures = [self._stream_sync(handle) for handle in self.streams]
        for handle in self.streams:
            failures.append(self._stream_destroy(handle))
        for address in self.device:
            failures.append(self._free(address))
        for address in self.host:
            failures.append(self._host_free(address))
        self.streams, self.device, self.host = [], [], []
        bad = [status for status in failures if status]
        if bad:
            raise RuntimeError(f"CUDA error: freeing a runner's memory failed with CUresult "
                               f"{bad[0]} ({len(bad)} call(s))")


def raw_graph_exec(graph: Any) -> int | None:
    """The cudaGraphExec_t of a captured torch CUDAGraph, or None where torch does not expose
    it (`raw_cuda_graph_exec`, torch 2.8 and later; JetPack's older wheels replay through
    torch instead).

    Launching it directly skips what `CUDAGraph.replay` adds per call: Python and dispatcher
    work, a device guard, and refreshing the RNG seed and offset of generators the capture
    registered. No kernel of an inference graph draws random numbers (eval mode: no
    dropout), so there is nothing for that refresh to change.
    """
    get = getattr(graph, "raw_cuda_graph_exec", None)
    if get is None:
        return None
    try:
        handle = int(get())
    except Exception:  # an older or a different binding: replay through torch
        return None
    return handle or None


# host_copy(dst, src, nbytes): memmove between host addresses that keeps the GIL
# (ctypes.memmove releases it). A window is ~60 KB, copied in microseconds, and re-taking the
# GIL after each of a batch's copies cost more than the copy. Called directly: no wrapper on
# the per-window path.
host_copy = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_size_t)(ctypes._memmove_addr)  # type: ignore[attr-defined]


def _bind(lib: Any, name: str, *argtypes: Any) -> Any:
    fn = getattr(lib, name)
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn
