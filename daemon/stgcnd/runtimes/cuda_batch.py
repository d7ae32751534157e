"""The host side of a batch on a CUDA device, shared by the torch and TensorRT runners: a
runner's driver memory, calls and graphs (on runtimes/cuda.py's context), and `LanedBatch`,
which moves a batch in and out around the runtime's compute.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stgcnd.runtimes.cuda import (
    CudaError,
    bind,
    check,
    error_name,
    first_failure,
    libraries,
    make_current,
)

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
            raise CudaError(f"CUDA error: freeing a runner's memory failed with "
                            f"{error_name(bad[0])} ({len(bad)} call(s))")


class DriverCalls:
    """A batch's host-side work as plain driver calls on handles prepared at start-up: a
    ctypes call into libcuda costs about a microsecond, where the same work through torch
    (`torch.cuda.stream`, `copy_`, `Event.record`, `Event.query`) costs several. Every call
    returns a CUresult; the hot path keeps the first failure (`first_failure`) and `check`s
    once."""

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
                                    f"{failure or error_name(status)}") from failure
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


# A runner owns its network (a torch CUDA graph, a TensorRT execution context or its graph) and
# the buffers it was built on; `LanedBatch` moves a batch in and out around it and says when it
# is done, with plain driver calls (`DriverCalls`) on addresses and handles taken at start-up:
#
# 1. `stage`: each window into its slot's row of the pinned host input (slot i: row i);
# 2. `upload`: each row up into its slot of the device input on its client's own stream (a
#    lane), the compute stream waiting for every upload by events; without lanes, the rows go
#    up in one copy on the compute stream;
# 3. `start`, then the runner enqueues its compute on `compute_stream`;
# 4. `finish`: the compute's end recorded; each client's stream waits for it and downloads its
#    logits row; the compute stream waits for every download and records `done`;
# 5. `done` (a query, for the I/O loop) or `wait` (a sleeping wait, for an executor thread),
#    then `collect`: the logits as float32 and the batch's device compute time.
#
# Only step 3 differs between runtimes, so everything else (the copies, the stream ordering,
# the completion) runs and is tested with torch on any GPU, TensorRT or not.
#
# Every call runs in the calling thread's current CUDA context: the runner makes the device's
# primary context current where it prepares, and `attach` where the I/O loop drives it.
class LanedBatch:
    def __init__(self, host_in: np.ndarray, host_out: np.ndarray, dev_in: int,
                 compute_stream: int, lane_streams: Sequence[int]) -> None:
        """host_in (rows, *window) and host_out (rows, num_class): page-locked arrays of the
        runtime's input and output dtypes; dev_in: the device input's address (rows of the
        same layout); compute_stream and lane_streams: CUstream handles."""
        self.host_in = host_in
        self.host_out = host_out
        self.compute_stream = int(compute_stream)
        self.lane_streams = [int(s) for s in lane_streams]
        self.lanes = len(self.lane_streams)
        self.in_bytes = int(host_in[0].nbytes)
        self.out_bytes = int(host_out[0].nbytes)
        self._in_dtype = host_in.dtype
        self.host_in_ptrs = [int(r.__array_interface__["data"][0]) for r in host_in]
        self.host_out_ptrs = [int(r.__array_interface__["data"][0]) for r in host_out]
        self.dev_in_ptrs = [int(dev_in) + i * self.in_bytes for i in range(len(host_in))]
        self.ops = ops = DriverCalls(2 * self.lanes)
        self.up_events = ops.events[:self.lanes]
        self.down_events = ops.events[self.lanes:]
        self.started = ops.event(CU_EVENT_DEFAULT)   # timed: the batch's compute_ms
        self.computed = ops.event(CU_EVENT_DEFAULT)
        # Blocking sync: a thread waiting for the batch sleeps until it is back instead of
        # spinning a core for the whole compute time (the default), which on a Jetson is a
        # core the cameras need. `poll_only` swaps it for the I/O loop, which only queries.
        self.done_event = ops.event(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING)
        self._n = 0

    def poll_only(self) -> None:
        """From now on `done` is only queried, never waited for: a blocking-sync event would
        still have CUDA's event thread woken by an interrupt at every batch's end, for
        nobody."""
        old, self.done_event = self.done_event, self.ops.event(CU_EVENT_DISABLE_TIMING)
        self.ops.release(old)

    def stage(self, windows: Sequence[np.ndarray]) -> None:
        """Each window into its slot's pinned row: windows of the input's dtype (float32 from
        the protocol) by a GIL-keeping memmove, others (float16) converted by numpy."""
        size, rows, dtype = self.in_bytes, self.host_in_ptrs, self._in_dtype
        for i, w in enumerate(windows):
            if w.dtype == dtype and w.flags.c_contiguous and w.nbytes == size:
                host_copy(rows[i], w.__array_interface__["data"][0], size)
            else:
                np.copyto(self.host_in[i], w, casting="same_kind")
        self._n = len(windows)

    def upload(self, lanes: Sequence[int]) -> int:
        """Enqueue the staged rows' uploads; the compute stream then waits for all of them.
        Returns the first failed call's CUresult, or 0 (`check`ed by `finish`)."""
        ops, main, size, rows = self.ops, self.compute_stream, self.in_bytes, self.host_in_ptrs
        if not self.lanes:
            return ops.htod(self.dev_in_ptrs[0], rows[0], self._n * size, main)
        htod, record, wait, bad = ops.htod, ops.record, ops.wait, 0
        for i, lane in enumerate(lanes):
            s, up = self.lane_streams[lane], self.up_events[lane]
            bad = first_failure(bad, htod(self.dev_in_ptrs[i], rows[i], size, s),
                                record(up, s), wait(main, up, 0))
        return bad

    def start(self) -> int:
        return self.ops.record(self.started, self.compute_stream)

    def finish(self, dev_out: int, lanes: Sequence[int], status: int = 0) -> None:
        """After the compute was enqueued: the downloads of its output rows (dev_out: the
        device output's address) and the done event. Raises if any call so far failed."""
        ops, main, size, n = self.ops, self.compute_stream, self.out_bytes, self._n
        record, wait = ops.record, ops.wait
        bad = first_failure(status, record(self.computed, main))
        if self.lanes:
            # Each client's stream waits for the batch and takes its own row down; the
            # compute stream (and so `done`) waits for every download.
            dtoh, computed = ops.dtoh, self.computed
            for i, lane in enumerate(lanes):
                s, down = self.lane_streams[lane], self.down_events[lane]
                bad = first_failure(bad, wait(s, computed, 0),
                                    dtoh(self.host_out_ptrs[i], dev_out + i * size, size, s),
                                    record(down, s), wait(main, down, 0))
        else:
            bad = first_failure(bad, ops.dtoh(self.host_out_ptrs[0], dev_out, n * size, main))
        bad = first_failure(bad, record(self.done_event, main))
        check(bad, "enqueueing the batch (copies, events, compute)")

    def done(self) -> bool:
        return self.ops.is_done(self.done_event)

    def wait(self) -> None:
        check(self.ops.synchronize(self.done_event), "cuEventSynchronize")

    def collect(self) -> tuple[np.ndarray, float]:
        """(the logits (n, K) float32, a copy; the batch's device compute time in ms). Only
        after `done` said so or `wait` returned."""
        out = self.host_out[:self._n]
        logits = out.astype(np.float32) if out.dtype != np.float32 else out.copy()
        return logits, self.ops.elapsed_ms(self.started, self.computed)

    def destroy(self) -> None:
        """Free the events (after the compute stream is synchronized: every lane's work was
        ordered before its end)."""
        self.ops.destroy()

