"""The daemon's CPU time (user + system seconds), to report CPU microseconds per request.

Sources, best first:
- `process_cpu_s` in the daemon's `stats` reply (the daemon measures itself; works remotely);
- psutil on a pid: the `pid` in the stats reply when the endpoint is on this machine, or the
  daemon `--serve` started;
- none: the report says null and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psutil

LOCAL_PREFIXES = ("ipc://", "inproc://", "tcp://127.", "tcp://localhost:", "tcp://[::1]:")


@dataclass(frozen=True)
class CpuSample:
    cpu_s: float | None
    source: str | None          # "stats", "psutil" or None
    pid: int | None
    note: str = ""


def is_local(endpoint: str) -> bool:
    return endpoint.startswith(LOCAL_PREFIXES)


def psutil_cpu_s(pid: int) -> float | None:
    try:
        times = psutil.Process(pid).cpu_times()
    except Exception:  # no psutil, no such process, no permission: no sample
        return None
    return float(times.user + times.system)


def sample(stats: dict[str, Any], endpoint: str, served_pid: int | None = None) -> CpuSample:
    """One reading of the daemon's CPU time from a stats reply (and what else we know)."""
    value = stats.get("process_cpu_s")
    pid = stats.get("pid")
    pid = int(pid) if isinstance(pid, int) else served_pid
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return CpuSample(float(value), "stats", pid)
    if pid is None:
        return CpuSample(None, None, None, "the daemon's stats reply has neither process_cpu_s "
                                           "nor pid")
    if pid != served_pid and not is_local(endpoint):
        return CpuSample(None, None, pid, f"stats has no process_cpu_s and {endpoint} is not "
                                          "on this machine")
    cpu = psutil_cpu_s(pid)
    if cpu is None:
        return CpuSample(None, None, pid, f"cannot read the CPU time of pid {pid} "
                                          "(not visible from here?)")
    return CpuSample(cpu, "psutil", pid)


def per_request(first: CpuSample, last: CpuSample, requests: int) -> dict[str, Any]:
    """The report's daemon_cpu entry: microseconds of daemon CPU per request answered."""
    out: dict[str, Any] = {"us_per_request": None, "cpu_s": None, "requests": requests,
                           "source": None, "pid": last.pid if last.pid is not None else first.pid,
                           "note": ""}
    if first.cpu_s is None or last.cpu_s is None or first.source != last.source:
        out["note"] = last.note or first.note or "the two samples came from different sources"
        return out
    cpu = last.cpu_s - first.cpu_s
    out.update(cpu_s=cpu, source=last.source)
    if requests > 0:
        out["us_per_request"] = cpu / requests * 1e6
    else:
        out["note"] = "no requests answered in the measured interval"
    return out
