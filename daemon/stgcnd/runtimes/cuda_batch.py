"""The host side of a batch on a CUDA device, shared by the torch and TensorRT runners.

`LanedBatch` stages, uploads, downloads and completes a batch with plain driver calls; only
the compute step differs between runtimes, so the rest runs and is tested with torch on any GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stgcnd.runtimes.cuda import (
    CU_EVENT_BLOCKING_SYNC,
    CU_EVENT_DEFAULT,
    CU_EVENT_DISABLE_TIMING,
    DriverCalls,
    check,
    host_copy,
)


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
        Returns the or'ed CUresults (`check` them after `finish`)."""
        ops, main, size, rows = self.ops, self.compute_stream, self.in_bytes, self.host_in_ptrs
        if not self.lanes:
            return ops.htod(self.dev_in_ptrs[0], rows[0], self._n * size, main)
        htod, record, wait, bad = ops.htod, ops.record, ops.wait, 0
        for i, lane in enumerate(lanes):
            s, up = self.lane_streams[lane], self.up_events[lane]
            bad |= htod(self.dev_in_ptrs[i], rows[i], size, s)
            bad |= record(up, s) | wait(main, up, 0)
        return bad

    def start(self) -> int:
        return self.ops.record(self.started, self.compute_stream)

    def finish(self, dev_out: int, lanes: Sequence[int], status: int = 0) -> None:
        """After the compute was enqueued: the downloads of its output rows (dev_out: the
        device output's address) and the done event. Raises if any call so far failed."""
        ops, main, size, n = self.ops, self.compute_stream, self.out_bytes, self._n
        record, wait = ops.record, ops.wait
        bad = status | record(self.computed, main)
        if self.lanes:
            # Each client's stream waits for the batch and takes its own row down; the
            # compute stream (and so `done`) waits for every download.
            dtoh, computed = ops.dtoh, self.computed
            for i, lane in enumerate(lanes):
                s, down = self.lane_streams[lane], self.down_events[lane]
                bad |= wait(s, computed, 0)
                bad |= dtoh(self.host_out_ptrs[i], dev_out + i * size, size, s)
                bad |= record(down, s) | wait(main, down, 0)
        else:
            bad |= ops.dtoh(self.host_out_ptrs[0], dev_out, n * size, main)
        bad |= record(self.done_event, main)
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

