"""Free memory, one way: what the memory plan, its self-correction and `stgcnd doctor` read.

A discrete GPU's figure is cuMemGetInfo. On an integrated GPU (a Jetson) it is MemAvailable,
not MemFree, which leaves out a page cache the GPU's allocations reclaim, less the cameras'
`memory_reserve_mb`. It is read with the CUDA context made, so the context is never free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stgcnd import board
from stgcnd.fsutil import read_system_file
from stgcnd.runtimes import cuda

MB = 1 << 20
_integrated: bool | None = None


def meminfo(text: str | None) -> dict[str, int]:
    """/proc/meminfo as {field: kB}."""
    out = {}
    for m in re.finditer(r"^(\w+):\s+(\d+)\s*kB", text or "", re.MULTILINE):
        out[m.group(1)] = int(m.group(2))
    return out


def device_memory() -> tuple[int, int]:
    """(free, total) bytes of memory the models may draw from, now: MemAvailable and MemTotal
    on an integrated GPU, cuMemGetInfo's on a discrete one. Raises what the driver raises."""
    free, total, _source = _measure()
    return free, total


def _measure() -> tuple[int, int, str]:
    global _integrated
    free, total = cuda.memory_info()
    if _integrated is None:
        _integrated = cuda.integrated()
    if not _integrated:
        return free, total, "cuMemGetInfo"
    info = meminfo(read_system_file(board.ROOT / "proc" / "meminfo"))
    if "MemAvailable" not in info:  # every L4T kernel has it; a stripped /proc may not
        return free, total, "cuMemGetInfo"
    return (info["MemAvailable"] * 1024, info.get("MemTotal", total // 1024) * 1024,
            "MemAvailable")


def reserve_mb(configured: int, jetson: bool) -> int:
    """`memory_reserve_mb` resolved: -1 is the cameras' default, 1536 MB on a Jetson."""
    if configured >= 0:
        return configured
    return board.JETSON_RESERVE_MB if jetson else 0


@dataclass(frozen=True)
class FreeMemory:
    """What `doctor` prints and the memory plan starts from."""

    free: int          # device_memory()'s free figure
    total: int
    reserve: int       # kept for the cameras and the OS (memory_reserve_mb)
    source: str        # "MemAvailable" or "cuMemGetInfo"

    @property
    def for_models(self) -> int:
        return max(self.free - self.reserve, 0)

    def describe(self) -> dict[str, object]:
        return {"memory_free_mb": self.free // MB, "memory_total_mb": self.total // MB,
                "reserve_mb": self.reserve // MB, "for_models_mb": self.for_models // MB,
                "source": self.source}


def free_memory(reserve: int) -> FreeMemory:
    """device_memory() now, with `reserve` bytes kept for the cameras."""
    free, total, source = _measure()
    return FreeMemory(free, total, reserve, source)
