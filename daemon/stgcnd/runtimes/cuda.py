"""The one CUDA layer: the driver API (libcuda) through ctypes, as NVIDIA's Polygraphy does.

Nothing is compiled on the board and nothing but the driver is needed. Everything runs on the
device's primary context, made current per thread with cuCtxSetCurrent, so any thread can
prepare, drive or close a runner.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from stgcnd.errors import BackendUnavailable
from stgcnd.log import get_logger

log = get_logger(__name__)

# - `CAPTURE_LOCK`: one stream capture at a time in the process (beginning a capture while
#   another thread's stream captures can invalidate it). Runners are prepared one at a time by
#   whichever thread loads the models, never concurrently. torch's graph replay takes it too
#   (torch refuses a replay while any thread captures), for microseconds.
# - `DriverMemory`: a runner's streams, device memory and page-locked host memory.
# - `DriverCalls`: a batch's host-side work (copies, events, graph launch), bound once.
# - `DriverGraph`: stream capture into a graph, instantiated and launched by handle. The graph
#   entry points are looked up when first used: a driver without them disables graphs (the
#   runner runs without), never the runner.
CAPTURE_LOCK = threading.Lock()

CU_EVENT_DEFAULT = 0x0          # timing enabled
CU_EVENT_BLOCKING_SYNC = 0x1    # cuEventSynchronize sleeps instead of spinning a core
CU_EVENT_DISABLE_TIMING = 0x2
CU_STREAM_NON_BLOCKING = 0x1    # no implicit ordering against the legacy default stream
CUDA_ERROR_NOT_READY = 600
_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1
_CU_ATTR_CC_MAJOR, _CU_ATTR_CC_MINOR = 75, 76
_CU_ATTR_INTEGRATED = 18  # CU_DEVICE_ATTRIBUTE_INTEGRATED: the GPU shares the host's memory

_lock = threading.Lock()
_libs: tuple[ctypes.CDLL, ctypes.PyDLL] | None = None
_primary: int | None = None


class CudaError(RuntimeError):
    """A driver call failed: the device or its context may be unusable (fatal to the daemon,
    which exits for systemd to restart it)."""


def libraries() -> tuple[ctypes.CDLL, ctypes.PyDLL]:
    """(CDLL, PyDLL) of libcuda. CDLL calls release the GIL (for calls that may block or take
    long: allocation, synchronization); PyDLL calls keep it (for calls that only enqueue work
    or read a flag in about a microsecond, where re-taking the GIL would cost more)."""
    global _libs
    with _lock:
        if _libs is None:
            try:
                _libs = (ctypes.CDLL("libcuda.so.1"), ctypes.PyDLL("libcuda.so.1"))
            except OSError as exc:
                raise BackendUnavailable(f"libcuda.so.1 not found ({exc}): no NVIDIA driver "
                                         "on this machine") from None
        return _libs


def check(status: int, what: str) -> None:
    if status:
        raise CudaError(f"CUDA error: {what} failed with {error_name(status)}")


def error_name(status: int) -> str:
    """'CUDA_ERROR_OUT_OF_MEMORY (CUresult 2)': the driver's name for a CUresult, which says
    more than the number; the number alone where the driver cannot name it."""
    try:
        lib = libraries()[0]
    except BackendUnavailable:
        return f"CUresult {status}"
    name_of = getattr(lib, "cuGetErrorName", None)
    name = ctypes.c_char_p()
    if name_of is None or name_of(ctypes.c_int(status), ctypes.byref(name)) or not name.value:
        return f"CUresult {status}"
    return f"{name.value.decode(errors='replace')} (CUresult {status})"


def bind(lib: ctypes.CDLL, name: str, *argtypes: Any) -> Any:
    fn = getattr(lib, name)
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


def primary_context() -> int:
    """The device's primary context, retained once per process (cuInit on first use)."""
    global _primary
    with _lock:
        if _primary is not None:
            return _primary
    lib = libraries()[0]
    device, ctx = ctypes.c_int(), ctypes.c_void_p()
    status = lib.cuInit(0)
    if status:
        raise BackendUnavailable(f"the CUDA driver does not initialise (CUresult {status}): "
                                 "check the GPU with nvidia-smi or tegrastats")
    check(lib.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
    with _lock:
        if _primary is None:
            _primary = int(ctx.value or 0)
        return _primary


def make_current() -> None:
    """Make the primary context current in the calling thread."""
    check(libraries()[0].cuCtxSetCurrent(ctypes.c_void_p(primary_context())),
          "cuCtxSetCurrent")


def memory_info() -> tuple[int, int]:
    """(free, total) bytes of device memory, now (on a Jetson: the RAM the GPU may take)."""
    make_current()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(libraries()[0].cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)),
          "cuMemGetInfo")
    return int(free.value), int(total.value)


def integrated() -> bool:
    """Whether GPU 0 is integrated (a Jetson): its memory is the board's RAM, so that
    cuMemGetInfo's free figure is the kernel's MemFree, without the reclaimable page cache
    (stgcnd/runtimes/free_memory.py reads the OS's MemAvailable instead)."""
    make_current()
    lib = libraries()[0]
    dev, flag = ctypes.c_int(), ctypes.c_int()
    check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(lib.cuDeviceGetAttribute(ctypes.byref(flag), _CU_ATTR_INTEGRATED, dev),
          "cuDeviceGetAttribute(INTEGRATED)")
    return bool(flag.value)


def device_properties() -> dict[str, str] | None:
    """GPU 0's name and compute capability, or None without a usable driver or GPU."""
    try:
        lib = libraries()[0]
    except BackendUnavailable:
        return None
    dev, name = ctypes.c_int(), ctypes.create_string_buffer(256)
    major, minor = ctypes.c_int(), ctypes.c_int()
    if (lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(dev), 0)
            or lib.cuDeviceGetName(name, 256, dev)
            or lib.cuDeviceGetAttribute(ctypes.byref(major), _CU_ATTR_CC_MAJOR, dev)
            or lib.cuDeviceGetAttribute(ctypes.byref(minor), _CU_ATTR_CC_MINOR, dev)):
        return None
    return {"name": name.value.decode(errors="replace"),
            "compute_capability": f"{major.value}.{minor.value}"}


class DriverMemory:
    """Streams, device memory and page-locked host memory of one runner. Allocation is
    start-up work; `free` works from any thread (the context is made current there)."""

    def __init__(self) -> None:
        lib = libraries()[0]
        ptr, size, uint, dev = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_uint64
        self._stream_create = bind(lib, "cuStreamCreate", ctypes.POINTER(ptr), uint)
        self._stream_destroy = bind(lib, "cuStreamDestroy_v2", ptr)
        self._stream_sync = bind(lib, "cuStreamSynchronize", ptr)
        self._alloc = bind(lib, "cuMemAlloc_v2", ctypes.POINTER(dev), size)
        self._free = bind(lib, "cuMemFree_v2", dev)
        self._memset = bind(lib, "cuMemsetD8Async", dev, ctypes.c_ubyte, size, ptr)
        self._host_alloc = bind(lib, "cuMemHostAlloc", ctypes.POINTER(ptr), size, uint)
        self._htod = bind(lib, "cuMemcpyHtoD_v2", dev, ptr, size)
        self._host_free = bind(lib, "cuMemFreeHost", ptr)
        self.streams: list[int] = []
        self.device: list[int] = []
        self.host: list[int] = []
        self.device_bytes = 0

    def stream(self) -> int:
        """A new non-blocking stream (CUstream handle)."""
        handle = ctypes.c_void_p()
        check(self._stream_create(ctypes.byref(handle), CU_STREAM_NON_BLOCKING),
              "cuStreamCreate")
        self.streams.append(int(handle.value or 0))
        return self.streams[-1]

    def device_zeros(self, nbytes: int, stream: int) -> int:
        """`nbytes` (at least 1) of device memory, zeroed on `stream` (synchronized here)."""
        nbytes = max(int(nbytes), 1)
        address = ctypes.c_uint64()
        check(self._alloc(ctypes.byref(address), nbytes), "cuMemAlloc")
        self.device.append(int(address.value))
        self.device_bytes += nbytes
        check(self._memset(address.value, 0, nbytes, stream), "cuMemsetD8Async")
        self.synchronize(stream)
        return self.device[-1]

    def pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A page-locked numpy array, valid until `free`."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = max(count * dtype.itemsize, 1)
        address = ctypes.c_void_p()
        check(self._host_alloc(ctypes.byref(address), nbytes, 0), "cuMemHostAlloc")
        self.host.append(int(address.value or 0))
        raw = (ctypes.c_ubyte * nbytes).from_address(self.host[-1])
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)

    def upload(self, address: int, host: np.ndarray) -> None:
        """Copy a contiguous host array to device memory, synchronously (start-up and
        calibration work; batches go through DriverCalls)."""
        host = np.ascontiguousarray(host)
        check(self._htod(address, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def synchronize(self, stream: int) -> None:
        check(self._stream_sync(stream), "cuStreamSynchronize")

    def synchronize_all(self) -> None:
        for handle in self.streams:
            self.synchronize(handle)

    def free(self) -> None:
        """Free everything once its streams are done; idempotent. Keeps going past a failed
        call, then raises."""
        make_current()
        failures = [self._stream_sync(handle) for handle in self.streams]
        failures += [self._stream_destroy(handle) for handle in self.streams]
        failures += [self._free(address) for address in self.device]
        failures += [self._host_free(address) for address in self.host]
        self.streams, self.device, self.host, self.device_bytes = [], [], [], 0
        bad = [status for status in failures if status]
        if bad:
            raise CudaError(f"CUDA error: freeing a runner's memory failed with CUresult "
                            f"{bad[0]} ({len(bad)} call(s))")


class DriverCalls:
    """A batch's host-side work as plain driver calls on handles prepared at start-up: a
    ctypes call into libcuda costs about a microsecond, where the same work through torch
    (`torch.cuda.stream`, `copy_`, `Event.record`, `Event.query`) costs several. Every call
    returns a CUresult; the hot path or's them together and `check`s once."""

    def __init__(self, events: int) -> None:
        cdll, lib = libraries()
        ptr, size, uint = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint
        dev = ctypes.c_uint64
        self.htod = bind(lib, "cuMemcpyHtoDAsync_v2", dev, ptr, size, ptr)
        self.dtoh = bind(lib, "cuMemcpyDtoHAsync_v2", ptr, dev, size, ptr)
        self.record = bind(lib, "cuEventRecord", ptr, ptr)
        self.wait = bind(lib, "cuStreamWaitEvent", ptr, ptr, uint)
        self.query = bind(lib, "cuEventQuery", ptr)
        self.synchronize = bind(cdll, "cuEventSynchronize", ptr)  # blocks: releases the GIL
        # The _v2 entry point (CUDA 12.8+) where the driver has it, else the original.
        elapsed = "cuEventElapsedTime_v2" if hasattr(lib, "cuEventElapsedTime_v2") else \
            "cuEventElapsedTime"
        self._elapsed = bind(lib, elapsed, ctypes.POINTER(ctypes.c_float), ptr, ptr)
        self._ms = ctypes.c_float()
        self._ms_ref = ctypes.byref(self._ms)
        self._create = bind(lib, "cuEventCreate", ctypes.POINTER(ptr), uint)
        self._destroy = bind(lib, "cuEventDestroy_v2", ptr)
        self.launch_graph: Callable[[int, int], int] | None = (
            bind(lib, "cuGraphLaunch", ptr, ptr) if hasattr(lib, "cuGraphLaunch") else None)
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
        check(self._create(ctypes.byref(handle), flags), "cuEventCreate")
        self.events.append(int(handle.value or 0))
        return self.events[-1]

    def release(self, handle: int) -> None:
        """Destroy one event now."""
        self.events.remove(handle)
        self._destroy(handle)

    def is_done(self, event: int) -> bool:
        """Whether everything before the event's record has finished (never blocks)."""
        status = self.query(event)
        if status == CUDA_ERROR_NOT_READY:
            return False
        check(status, "cuEventQuery")
        return True

    def elapsed_ms(self, start: int, end: int) -> float:
        check(self._elapsed(self._ms_ref, start, end), "cuEventElapsedTime")
        return float(self._ms.value)

    def destroy(self) -> None:
        for handle in self.events:
            self._destroy(handle)
        self.events = []


class GraphsUnavailable(RuntimeError):
    """This driver has no graph API, or a capture failed: run without graphs."""


class DriverGraph:
    """One captured sequence of work on a stream, replayed with a single launch. Capture is
    thread-local: other threads keep running their streams meanwhile."""

    def __init__(self, stream: int) -> None:
        lib = libraries()[0]
        names = ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
                 "cuGraphExecDestroy", "cuGraphDestroy")
        missing = [n for n in names if not hasattr(lib, n)]
        if missing:
            raise GraphsUnavailable(f"this CUDA driver lacks {', '.join(missing)}")
        self._lib = lib
        self.stream = ctypes.c_void_p(stream)
        self._graph = ctypes.c_void_p()
        self._exec = ctypes.c_void_p()

    def capture(self, work: Callable[[], object]) -> DriverGraph:
        """Capture `work()` (which enqueues on the stream) and instantiate it. On failure the
        capture is ended, the partial graph destroyed and GraphsUnavailable raised."""
        lib = self._lib
        check(lib.cuStreamBeginCapture_v2(self.stream, _CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture")
        failure: BaseException | None = None
        try:
            if work() is False:  # e.g. execute_async_v3 refusing to enqueue while capturing
                failure = RuntimeError("the captured work reported failure")
        except Exception as exc:
            failure = exc
        # Always end the capture: a stream left capturing fails every later enqueue.
        status = lib.cuStreamEndCapture(self.stream, ctypes.byref(self._graph))
        if failure is None and not status:
            status = lib.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph,
                                                     ctypes.c_ulonglong(0))
        if failure is not None or status:
            self.destroy()
            raise GraphsUnavailable(f"CUDA graph capture failed: "
                                    f"{failure or f'CUresult {status}'}") from failure
        return self

    @property
    def exec_handle(self) -> int:
        """The instantiated graph (CUgraphExec), for `DriverCalls.launch_graph`."""
        return int(self._exec.value or 0)

    def destroy(self) -> None:
        if self._exec:
            self._lib.cuGraphExecDestroy(self._exec)
            self._exec = ctypes.c_void_p()
        if self._graph:
            self._lib.cuGraphDestroy(self._graph)
            self._graph = ctypes.c_void_p()


# host_copy(dst, src, nbytes): memmove between host addresses that keeps the GIL
# (ctypes.memmove releases it). A window is ~60 KB, copied in microseconds, and re-taking the
# GIL after each of a batch's copies cost more than the copy.
host_copy = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_size_t)(ctypes._memmove_addr)  # type: ignore[attr-defined]
