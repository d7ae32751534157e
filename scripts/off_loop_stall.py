"""What loading a model beside the I/O loop costs the loop: a ZeroMQ echo polled on the main
thread (as the daemon's loop polls) answers a camera paced at RATE Hz (another process, a
59,400-byte window a request) while a thread compiles the demo ST-GCN with torch.compile for
three batch sizes (inductor's caches warm: what an upgrade or reload does in the daemon).

    PYTHONPATH=daemon:clients:tools python scripts/off_loop_stall.py [--trials 2] [--rate 200]

Two ways to run the compile, alternated, each trial a fresh process, the loop's switch
interval the daemon's: in a plain thread, and through `stgcnd.server.models.in_thread`
(what the daemon runs beside the loop with: full garbage collections held off and a shorter
switch interval meanwhile, server/beside_loop.py). Prints each trial's round trip
(p50 / p99 / max, over the compile and the 3 s after it), the full collections during the
compile and their longest pause, and those in the 3 s after. On a CPU
torch.compile runs inductor's C++ kernels (a compiler is needed); the first, cold trial fills
its cache and is not counted.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import zmq

from stgcnd.server import beside_loop

WINDOW = b"\0" * 59_400
BATCHES = (1, 2, 4)
AFTER_S = 3.0  # served on after the compile: where the full collection held off comes


def camera(endpoint: str, rate: float, seconds: float) -> None:
    """The paced camera (a process of its own): round trips in ms, as JSON on stdout."""
    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(endpoint)
    trips: list[float] = []
    period, due = 1 / rate, time.perf_counter()
    end = due + seconds

    def stop(signum: int, frame: object) -> None:
        raise SystemExit

    signal.signal(signal.SIGTERM, stop)  # the trial is over: the trips so far
    try:
        while due < end:
            t0 = time.perf_counter()
            sock.send_multipart([b"", WINDOW])
            sock.recv_multipart()
            trips.append((time.perf_counter() - t0) * 1e3)
            due += period
            time.sleep(max(0.0, due - time.perf_counter()))
    finally:
        print(json.dumps(trips), flush=True)


def compile_demo(module: torch.nn.Module, device: str) -> None:
    with torch.inference_mode():
        for b in BATCHES:
            fn = torch.compile(module, dynamic=False)
            fn(torch.rand(b, 3, 150, 33, 1, device=device))


def trial(way: str, rate: float, device: str) -> dict[str, object]:
    from stgcnd.model.loader import load_model
    from stgcnd.model.spec import ModelSpec
    from stgcnd.server.models import in_thread

    torch.set_num_threads(1)
    # Loaded before serving, as the daemon's are; torch.compile's own modules are imported
    # at its first call, which the daemon's first compile (before READY) has made already.
    module = load_model(ModelSpec()).module.to(device)
    importlib.import_module("torch._dynamo")
    importlib.import_module("torch._inductor.compile_fx")
    pauses: list[tuple[int, float, float]] = []  # generation, ms, when (perf_counter)
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            pauses.append((info["generation"], (time.perf_counter() - started[0]) * 1e3,
                           started[0]))

    gc.callbacks.append(on_gc)
    beside_loop.loop_serves()  # as the daemon's loop does: its switch interval
    plain = ThreadPoolExecutor(1)  # a thread as the daemon's was before: nothing held off
    run: Callable[[str, Callable[[], None]], Future[None]] = in_thread if way == "in_thread" \
        else lambda _name, work: plain.submit(work)
    endpoint = f"ipc://{tempfile.mkdtemp()}/echo.sock"
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.bind(endpoint)
    cam = subprocess.Popen([sys.executable, __file__, "--camera", endpoint, str(rate), "600"],
                           stdout=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    work: Future[None] | None = None
    done_at: float | None = None
    done_pc = 0.0
    polled = [(router, zmq.POLLIN)]
    while done_at is None or time.monotonic() < done_at + AFTER_S:
        if work is None and time.monotonic() > t0 + 1.0:  # a second of quiet first
            work, work_t0 = run("compile", lambda: compile_demo(module, device)), time.monotonic()
        if work is not None and done_at is None and work.done():
            work.result()
            done_at, done_pc = time.monotonic(), time.perf_counter()
        if zmq.zmq_poll(polled, 50):
            while True:
                try:
                    frames = router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                router.send_multipart([frames[0], b"", b"ok"])
    cam.terminate()
    out, _ = cam.communicate()
    trips = np.array(json.loads(out.splitlines()[-1]) if out.strip() else [])
    full = [ms for gen, ms, at in pauses if gen == 2 and at < done_pc]
    after = [ms for gen, ms, at in pauses if gen == 2 and at >= done_pc]
    return {"way": way, "compile_s": round(done_at - work_t0, 1), "trips": len(trips),
            "p50": float(np.percentile(trips, 50)), "p99": float(np.percentile(trips, 99)),
            "max": float(trips.max()), "full_collections": len(full),
            "longest_full_ms": round(max(full, default=0.0), 1),
            "longest_young_ms": round(max((ms for g, ms, _ in pauses if g < 2), default=0.0), 1),
            "full_after": [round(ms, 1) for ms in after]}


def main() -> None:
    if sys.argv[1:2] == ["--camera"]:  # the camera's process; killed when the trial ends
        camera(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
        return
    if sys.argv[1:2] == ["--trial"]:
        print(json.dumps(trial(sys.argv[2], float(sys.argv[3]), sys.argv[4])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=2, help="of each way, alternated")
    ap.add_argument("--rate", type=float, default=200.0, help="the camera's requests a second")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-")}
    ways = ["plain"] + ["plain", "in_thread"] * args.trials  # the first fills the cache

    for i, way in enumerate(ways):
        proc = subprocess.run([sys.executable, __file__, "--trial", way, str(args.rate),
                               args.device], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"trial {way} failed:\n{proc.stderr[-2000:]}")
        r = json.loads(proc.stdout.splitlines()[-1])
        print(("(cold, not counted) " if i == 0 else "") +
              f"{r['way']:>9}: compile {r['compile_s']} s; round trip p50 {r['p50']:.2f} "
              f"p99 {r['p99']:.2f} max {r['max']:.1f} ms over {r['trips']}; full collections "
              f"{r['full_collections']} (longest {r['longest_full_ms']} ms), longest young "
              f"{r['longest_young_ms']} ms; full collections in the {AFTER_S:g} s after: "
              f"{r['full_after'] or 'none'} ms", flush=True)


if __name__ == "__main__":
    main()
