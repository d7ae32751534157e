"""The one CUDA layer: the driver API (libcuda) through ctypes, as NVIDIA's Polygraphy does.

Nothing is compiled on the board and nothing but the driver is needed. Everything runs on the
device's primary context, made current per thread with cuCtxSetCurrent, so any thread can
prepare, drive or close a runner. This module finds the driver, the device and its memory;
a runner's streams, buffers, calls and graphs are runtimes/cuda_batch.py's.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from stgcnd.errors import BackendUnavailable
from stgcnd.log import get_logger

log = get_logger(__name__)

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


def first_failure(*statuses: int) -> int:
    """The first non-zero CUresult of calls made in turn (0 if all worked): or-ing them would
    name an error none of them returned."""
    for status in statuses:
        if status:
            return status
    return 0


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
        raise BackendUnavailable(f"the CUDA driver does not initialise ({error_name(status)}): "
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
