"""Per-thread CPU time and context switches of a running process, over an interval (Linux).

    python3 scripts/thread_cpu.py PID SECONDS [REQUESTS_PER_S]

Reads /proc/PID/task/*/stat and status before and after; prints each thread that ran, with
its CPU seconds, voluntary (it slept: a wake-up each) and involuntary (preempted) switches,
and, given the request rate, each per request. Used for docs/benchmarks.md: which of the
daemon's threads (I/O loop, executors, ZeroMQ's I/O thread) spend its CPU per request.
"""

from __future__ import annotations

import os
import sys
import time


def snapshot(pid: int) -> dict[str, tuple[str, int, int, int]]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[11]) + int(fields[12])  # utime + stime
        vol = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
        invol = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        out[tid] = (name, ticks, vol, invol)
    return out


def main() -> int:
    pid, seconds = int(sys.argv[1]), float(sys.argv[2])
    rate = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    hz = os.sysconf("SC_CLK_TCK")
    before = snapshot(pid)
    time.sleep(seconds)
    after = snapshot(pid)
    print(f"{'thread':24s} {'cpu s':>7s} {'vol':>7s} {'invol':>7s}"
          + ("   us/req  vol/req  invol/req" if rate else ""))
    for tid, (name, ticks, vol, invol) in sorted(after.items()):
        if tid not in before:
            continue
        cpu = (ticks - before[tid][1]) / hz
        dv, di = vol - before[tid][2], invol - before[tid][3]
        if cpu == 0 and dv == 0:
            continue
        line = f"{name + ' ' + tid:24s} {cpu:7.2f} {dv:7d} {di:7d}"
        if rate:
            n = rate * seconds
            line += f"  {cpu / n * 1e6:7.0f}  {dv / n:7.2f}  {di / n:9.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
