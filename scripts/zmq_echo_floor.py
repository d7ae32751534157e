"""The floor under stgcnd's round trip and CPU: bare ZeroMQ over ipc, no daemon.

    python3 scripts/zmq_echo_floor.py [N]                  # one camera, closed loop, N trips
    python3 scripts/zmq_echo_floor.py --open P K RATE SECONDS   # P processes x K cameras
    python3 scripts/zmq_echo_floor.py N --hold-us US [--spin]   # answer US microseconds late
    python3 scripts/zmq_echo_floor.py N --hold-us US --rate HZ  # one camera sending HZ a second

Cameras (DEALERs) send what a window request is on the wire (a small header frame and one
M=1 window, 59,400 bytes) to a ROUTER in another process that answers a 60-byte frame at
once. Closed loop, one camera: prints the round trip's p50 / p90 / p99. Open loop: K cameras
per process, each sending RATE windows a second, phases spread evenly (as `stgcnd loadtest
--rate`), for SECONDS. Both print the echoing process's CPU per request: its own thread and
ZeroMQ's I/O thread, from its CPU clock, after the first thousand requests.

`--hold-us` makes the echo answer each request that long after it arrived, as the daemon does
while the GPU computes: asleep (every thread on the path idles meanwhile), or with `--spin`
busy-waiting (the echo's own thread stays awake). The round trip minus the hold is then the
floor for a camera whose windows take that long to compute.

`--rate` paces that one camera as a real one is paced (25 windows a second): between round
trips every thread on the path sleeps for most of 40 ms, not for one hold, so each request
finds them as a camera's window does in service.

The daemon's overhead (round trip minus compute) and its CPU per request cannot go below
these on the same machine: both ends pay ZeroMQ's I/O threads and the ipc socket, with no
decoding, checking or inference in between.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

REQUEST = [b"h" * 90, np.zeros((3, 150, 33, 1), np.float32).tobytes()]
WARM_UP = 1000


def exact_sleeps() -> None:
    """Linux lets a sleeping thread oversleep by its timer slack (50 us by default), which the
    daemon's timerfd does not pay; ask for 1 ns so that a sleeping hold is as exact."""
    try:
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


def hold(seconds: float, spin: bool) -> None:
    if seconds <= 0:
        return
    if not spin:
        time.sleep(seconds)
        return
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def serve(endpoint: str, hold_s: float = 0.0, spin: bool = False) -> None:
    exact_sleeps()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    reply = b"r" * 60
    served, cpu0, warm = 0, 0.0, False
    while True:
        msg = router.recv_multipart(copy=False)
        if len(msg) == 2 and msg[1].bytes == b"stop":
            # Fewer requests than the warm-up (a paced run): the clock also holds start-up.
            cpu_us = (time.process_time() - cpu0) / served * 1e6 if warm and served else -1.0
            router.send_multipart([msg[0].bytes, f"{cpu_us:.1f} {served}".encode()])
            break
        hold(hold_s, spin)
        router.send_multipart([msg[0].bytes, reply])
        served += 1
        if served == WARM_UP and not warm:
            served, cpu0, warm = 0, time.process_time(), True
    router.close(0)
    ctx.term()


def cameras(endpoint: str, k: int, rate: float, seconds: float, offset: float) -> None:
    """K cameras in one thread, each sending `rate` windows a second (open loop)."""
    ctx = zmq.Context()
    socks = []
    for _ in range(k):
        s = ctx.socket(zmq.DEALER)
        s.connect(endpoint)
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    period = 1.0 / rate
    start = time.monotonic() + 0.5
    due = [start + (offset + j / k) * period for j in range(k)]
    end = start + seconds
    while True:
        now = time.monotonic()
        j = min(range(k), key=due.__getitem__)
        if due[j] >= end:
            break
        timeout = max(due[j] - now, 0.0)
        for sock, _ in poller.poll(timeout * 1e3):
            while sock.get(zmq.EVENTS) & zmq.POLLIN:
                sock.recv_multipart(zmq.NOBLOCK)
        if time.monotonic() >= due[j]:
            socks[j].send_multipart(REQUEST)
            due[j] += period
    time.sleep(0.2)
    for s in socks:
        s.close(0)
    ctx.term()


def stop(endpoint: str) -> str:
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"stop"])
    cpu_us, served = dealer.recv_multipart()[-1].decode().split()
    dealer.close(0)
    ctx.term()
    if float(cpu_us) < 0:
        return f"echo process CPU not measured (fewer than {WARM_UP} requests)"
    return f"echo process CPU {cpu_us} us/request over {served} requests"


def closed(endpoint: str, n: int, hold_s: float = 0.0, rate: float = 0.0) -> str:
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    times = []
    period = 1.0 / rate if rate > 0 else 0.0
    due = time.perf_counter()
    for _ in range(n):
        if period:
            due += period
        t0 = time.perf_counter()
        dealer.send_multipart(REQUEST)
        dealer.recv_multipart()
        times.append(time.perf_counter() - t0)
        if period:
            time.sleep(max(due - time.perf_counter(), 0.0))
    dealer.close(0)
    ctx.term()
    ms = (np.array(times[n // 10:]) - hold_s) * 1e3  # the first tenth warms up
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    held = f", minus a {hold_s * 1e6:g} us hold" if hold_s else ""
    paced = f"at {rate:g} Hz" if rate > 0 else "closed loop"
    return (f"zmq ipc echo, {len(REQUEST[1])}-byte request, one camera {paced}{held}: p50 "
            f"{p50:.3f} / p90 {p90:.3f} / p99 {p99:.3f} ms over {len(ms)} round trips")


def main() -> int:
    args = sys.argv[1:]
    spin = "--spin" in args
    if spin:
        args.remove("--spin")
    hold_s = 0.0
    if "--hold-us" in args:
        i = args.index("--hold-us")
        hold_s = float(args[i + 1]) / 1e6
        del args[i:i + 2]
    rate = 0.0
    if "--rate" in args:
        i = args.index("--rate")
        rate = float(args[i + 1])
        del args[i:i + 2]
    if len(args) == 2 and args[0] == "--serve":
        serve(args[1], hold_s, spin)
        return 0
    if len(args) == 6 and args[0] == "--cameras":
        cameras(args[1], int(args[2]), float(args[3]), float(args[4]), float(args[5]))
        return 0
    endpoint = f"ipc://{Path(tempfile.mkdtemp()) / 'echo.sock'}"
    held = ["--hold-us", str(hold_s * 1e6)] + (["--spin"] if spin else [])
    server = subprocess.Popen([sys.executable, __file__, "--serve", endpoint, *held])
    try:
        if args and args[0] == "--open":
            p, k, rate, seconds = int(args[1]), int(args[2]), float(args[3]), float(args[4])
            procs = [subprocess.Popen([sys.executable, __file__, "--cameras", endpoint, str(k),
                                       str(rate), str(seconds), str(i / p)]) for i in range(p)]
            for proc in procs:
                proc.wait()
            head = (f"zmq ipc echo, {p} x {k} cameras at {rate:g} Hz for {seconds:g} s "
                    f"({p * k * rate:g} requests/s offered)")
        else:
            head = closed(endpoint, int(args[0]) if args else 10000, hold_s, rate)
            if hold_s:
                head += " (the echo " + ("spins" if spin else "sleeps") + " meanwhile)"
        print(f"{head}; {stop(endpoint)}")
    finally:
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
