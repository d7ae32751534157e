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

The pieces live in stgcnd_tools.loadtest.echo_floor, which `stgcnd loadtest --scenario` runs
itself to judge the daemon against the floor of the same machine in the same run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

try:
    from stgcnd_tools.loadtest import echo_floor
except ImportError:  # run from a checkout without `pip install -e .`: use the checkout's
    for package_dir in ("daemon", "tools"):  # echo_floor imports stgcnd.errors
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / package_dir))
    from stgcnd_tools.loadtest import echo_floor


def echo_cpu(cpu: echo_floor.EchoCpu) -> str:
    if cpu.us_per_request is None:
        return f"echo process CPU not measured (fewer than {echo_floor.WARM_UP} requests)"
    return f"echo process CPU {cpu.us_per_request:.1f} us/request over {cpu.requests} requests"


def closed(n: int, hold_s: float, spin: bool, rate: float) -> str:
    with echo_floor.Echo(hold_s=hold_s, spin=spin) as echo:
        times = echo_floor.closed_loop(echo.endpoint, n, rate)
        cpu = echo.stop()
    ms = (np.array(times[n // 10:]) - hold_s) * 1e3  # the first tenth warms up
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    held = f", minus a {hold_s * 1e6:g} us hold" if hold_s else ""
    paced = f"at {rate:g} Hz" if rate > 0 else "closed loop"
    head = (f"zmq ipc echo, {len(echo_floor.REQUEST[1])}-byte request, one camera {paced}{held}:"
            f" p50 {p50:.3f} / p90 {p90:.3f} / p99 {p99:.3f} ms over {len(ms)} round trips")
    if hold_s:
        head += " (the echo " + ("spins" if spin else "sleeps") + " meanwhile)"
    return f"{head}; {echo_cpu(cpu)}"


def open_loop(processes: int, cameras: int, rate: float, seconds: float) -> str:
    # The echo's warm-up as in the closed loop: its first thousand requests.
    warmup_s = min(echo_floor.WARM_UP / (processes * cameras * rate), seconds / 2)
    floor = echo_floor.measure(processes, cameras, rate, seconds, warmup_s=warmup_s)
    cpu = echo_floor.EchoCpu(floor.echo_cpu_us_per_request, floor.echo_requests)
    rt = floor.round_trip_ms
    trips = (f"; round trip p50 {rt['p50']:.3f} / p99 {rt['p99']:.3f} ms"
             if rt["count"] else "")
    return (f"zmq ipc echo, {processes} x {cameras} cameras at {rate:g} Hz for {seconds:g} s "
            f"({processes * cameras * rate:g} requests/s offered){trips}; {echo_cpu(cpu)}")


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
    if args and args[0] == "--open":
        print(open_loop(int(args[1]), int(args[2]), float(args[3]), float(args[4])))
    else:
        print(closed(int(args[0]) if args else 10000, hold_s, spin, rate))
    return 0


if __name__ == "__main__":
    sys.exit(main())
