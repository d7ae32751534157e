"""Which machine this is: a Jetson (and which, on which L4T release) or anything else.

On a Jetson the GPU shares the RAM with the CPU and the cameras, so the daemon plans memory
with a reserve, batches at most 8 windows by default and gives TensorRT a smaller workspace.
Read from files only (/etc/nv_tegra_release, the device tree, /proc/meminfo, under `ROOT`),
so it works before anything is installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/")
JETSON_MAX_BATCH = 8
JETSON_RESERVE_MB = 1536     # left to the cameras and the OS out of the shared memory
JETSON_WORKSPACE_MB = 384    # TensorRT builder workspace (1 GiB elsewhere)


@dataclass(frozen=True)
class Board:
    jetson: bool
    model: str                 # "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
    l4t: str | None            # "35.4.1"
    memory_mb: int             # physical memory (shared with the GPU on a Jetson)


def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel).read_bytes().decode(errors="replace")
    except OSError:
        return None


def l4t_release(text: str | None) -> str | None:
    """'35.4.1' from '# R35 (release), REVISION: 4.1, GCID: ..., BOARD: t186ref, ...'."""
    m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)", text or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def detect(root: Path | None = None) -> Board:
    root = ROOT if root is None else root
    release = l4t_release(_read(root, "etc/nv_tegra_release"))
    model = (_read(root, "proc/device-tree/model") or "").replace("\x00", "").strip()
    mem = re.search(r"MemTotal:\s*(\d+)\s*kB", _read(root, "proc/meminfo") or "")
    jetson = release is not None or "jetson" in model.lower()
    return Board(jetson, model or ("Jetson" if jetson else ""), release,
                 int(mem.group(1)) // 1024 if mem else 0)
