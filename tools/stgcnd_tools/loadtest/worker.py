"""One load process (started with multiprocessing's spawn context): K camera threads,
reporting to the parent over one shared result queue (protocol above `process_main`).
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from typing import Any

from stgcnd_tools.loadtest.camera import Camera, ModelTarget, RunClock
from stgcnd_tools.loadtest.plan import LoadPlan

# Cameras present from the start get this long to connect before the process gives up.
READY_TIMEOUT_S = 60.0


# Protocol with the parent, over one result queue shared by all processes:
#   ("ready", process)              every camera built its data; those present from the start
#                                   are connected and answered a ping
#   ... the parent sets `start_wall` and the `go` event ...
#   ("done", process, [CameraResult], cpu_s) once every camera thread has finished; cpu_s is
#                                   this process's own CPU time over the run (all threads)
#   ("failed", process, message)    something went wrong before the run could start
def process_main(process: int, plan: LoadPlan, target: ModelTarget, results: Any,
                 go: Any, start_wall: Any, stop: Any) -> None:
    """Entry point of a load process; every argument pickles (spawn)."""
    # Ctrl-C reaches the whole process group: the parent decides when to stop, through `stop`.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _run(process, plan, target, results, go, start_wall, stop)
    except Exception:
        results.put(("failed", process, traceback.format_exc()))


def _run(process: int, plan: LoadPlan, target: ModelTarget, results: Any, go: Any,
         start_wall: Any, stop: Any) -> None:
    clock = RunClock()
    local_stop = threading.Event()
    cameras = [Camera(plan, c, target, clock, local_stop) for c in plan.cameras_of(process)]
    threads = [threading.Thread(target=c.run, name=c.camera.camera_id, daemon=True)
               for c in cameras]
    for t in threads:
        t.start()
    for c in cameras:
        if not c.ready.wait(READY_TIMEOUT_S) or c.result.stopped:
            local_stop.set()
            clock.go.set()
            reason = c.result.stopped or f"not connected within {READY_TIMEOUT_S:.0f} s"
            results.put(("failed", process, f"camera {c.camera.camera_id}: {reason}"))
            return
    results.put(("ready", process))
    # The parent's stop event (Ctrl-C, a failed sibling) reaches the threads through local_stop.
    watcher = threading.Thread(target=_forward_stop, args=(stop, local_stop), daemon=True)
    watcher.start()
    go.wait()
    clock.start_at(start_wall.value)
    cpu0 = time.process_time()
    # Every thread ends by the run's end plus one request's timeout; allow a margin on top.
    limit = plan.end + plan.timeout_ms / 1e3 + 10.0
    for t in threads:
        t.join(max(limit - clock.now(), 0.1))
    local_stop.set()
    for t in threads:
        t.join(5.0)
    unfinished = [t.name for t in threads if t.is_alive()]
    for c in cameras:
        if c.camera.camera_id in unfinished:
            c.result.stopped = "still running at the end of the run (hung request?)"
    cpu_s = time.process_time() - cpu0
    results.put(("done", process, [c.result for c in cameras], cpu_s))


def _forward_stop(stop: Any, local_stop: threading.Event) -> None:
    while not local_stop.is_set():
        if stop.wait(0.5):
            local_stop.set()
