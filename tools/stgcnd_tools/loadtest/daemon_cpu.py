"""The daemon's CPU per request, one definition (docs/performance.md, "CPU per request"):
the daemon's CPU time over an interval divided by the requests it read from every client,
both from its own `stats` replies, so that other clients' work is not charged to the load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psutil

from stgcnd_tools.stats import number

LOCAL_PREFIXES = ("ipc://", "inproc://", "tcp://127.", "tcp://localhost:", "tcp://[::1]:")
# The daemon read this many more requests than the load sent (beyond its own few control
# calls): other clients share it, which the report says.
OTHER_CLIENTS_SHARE = 0.05


# CPU time sources, best first: `process_cpu_s` in the stats reply (works remotely), psutil
# on the reply's pid (a local endpoint) or on the daemon --serve started; else none, and why.
# /proc is read beside each local sample as a check (`proc_us_per_request`).
@dataclass(frozen=True)
class CpuSample:
    cpu_s: float | None
    source: str | None          # "stats", "psutil" or None
    pid: int | None
    note: str = ""
    requests: int | None = None       # the daemon's `requests` counter, same stats reply
    proc_cpu_s: float | None = None   # /proc's reading of the pid just after, when local


def is_local(endpoint: str) -> bool:
    return endpoint.startswith(LOCAL_PREFIXES)


def psutil_cpu_s(pid: int) -> float | None:
    try:
        times = psutil.Process(pid).cpu_times()
    except Exception:  # no psutil, no such process, no permission: no sample
        return None
    return float(times.user + times.system)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def sample(stats: dict[str, Any], endpoint: str, served_pid: int | None = None) -> CpuSample:
    """One reading of the daemon's CPU time and request count from a stats reply (and what
    else we know)."""
    value = number(stats.get("process_cpu_s"))
    requests = _int(stats.get("requests"))
    pid = _int(stats.get("pid"))
    pid = pid if pid is not None else served_pid
    local = pid is not None and (pid == served_pid or is_local(endpoint))
    proc = psutil_cpu_s(pid) if local and pid is not None else None
    if value is not None:
        return CpuSample(float(value), "stats", pid, requests=requests, proc_cpu_s=proc)
    if pid is None:
        return CpuSample(None, None, None, "the daemon's stats reply has neither process_cpu_s "
                                           "nor pid", requests)
    if not local:
        return CpuSample(None, None, pid, f"stats has no process_cpu_s and {endpoint} is not "
                                          "on this machine", requests)
    if proc is None:
        return CpuSample(None, None, pid, f"cannot read the CPU time of pid {pid} "
                                          "(not visible from here?)", requests)
    return CpuSample(proc, "psutil", pid, requests=requests, proc_cpu_s=proc)


def per_request(first: CpuSample, last: CpuSample, load_replies: int) -> dict[str, Any]:
    """The report's daemon_cpu entry: microseconds of daemon CPU per request the daemon read
    between the two samples; `load_replies` (this load's, over the measured interval) only
    tells whether other clients shared the daemon."""
    out: dict[str, Any] = {"us_per_request": None, "cpu_s": None, "requests": None,
                           "load_replies": load_replies, "other_clients": None,
                           "proc_us_per_request": None, "source": None,
                           "pid": last.pid if last.pid is not None else first.pid, "note": ""}
    if first.requests is not None and last.requests is not None:
        out["requests"] = last.requests - first.requests
    if first.cpu_s is None or last.cpu_s is None or first.source != last.source:
        out["note"] = last.note or first.note or "the two samples came from different sources"
        return out
    cpu = last.cpu_s - first.cpu_s
    out.update(cpu_s=cpu, source=last.source)
    requests = out["requests"]
    if requests is None:
        out["note"] = "the daemon's stats reply has no requests counter"
    elif requests <= 0:
        out["note"] = "the daemon read no requests in the measured interval"
    else:
        out["us_per_request"] = cpu / requests * 1e6
        out["other_clients"] = requests > load_replies * (1 + OTHER_CLIENTS_SHARE) + 10
        if first.proc_cpu_s is not None and last.proc_cpu_s is not None:
            out["proc_us_per_request"] = (last.proc_cpu_s - first.proc_cpu_s) / requests * 1e6
    return out
