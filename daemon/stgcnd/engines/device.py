"""What device an artefact was built for: GPU name and compute capability, Jetson release.

These go into the store's cache key (engines/builders/base.py's device_identity, which loads
this module for a CUDA device only), so a JetPack upgrade or another GPU rebuilds with a log
line saying what changed. The GPU is asked through torch only when it is already imported,
else the CUDA driver, else nvidia-smi.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from stgcnd.board import detect
from stgcnd.runtimes.cuda import device_properties


# The TensorRT libraries an engine is tied to, as Debian packages: JetPack 5 and 6.0 ship
# libnvinfer8 (8.5.2-1+cuda11.4, 8.6.2.3-1+cuda12.2), JetPack 6.1+ and 7 libnvinfer10
# (10.3.0.30-1+cuda12.5, ...); NVIDIA's x86 apt repository uses the same names. The Python
# module's version ("8.5.2.2") does not show a rebuilt package (-1 -> -2, +cuda11.4 ->
# +cuda11.8), which can change the engine format.
TENSORRT_DPKG_PATTERNS = ("libnvinfer[0-9]*", "libnvinfer-plugin[0-9]*",
                          "libnvonnxparsers[0-9]*")
_DPKG_FORMAT = "${Package}\t${Version}\t${db:Status-Abbrev}\n"


def parse_dpkg_packages(text: str) -> dict[str, str]:
    """Installed packages' versions from `dpkg-query -W -f '<_DPKG_FORMAT>' PATTERN...`.

    dpkg also lists packages it merely knows of (status 'un', no version): those are
    skipped, as are half-installed or removed ones (only status 'ii' counts)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) < 3:
            continue
        name, version, status = (f.strip() for f in fields[:3])
        if name and version and status.startswith("ii"):
            out[name] = version
    return out


@lru_cache(maxsize=None)
def dpkg_packages(*patterns: str) -> dict[str, str]:
    """{package: version} of the installed packages matching `patterns`; {} without dpkg
    (pip wheels, non-Debian systems) or without the packages. Asked once per process (~30 ms)."""
    if not shutil.which("dpkg-query"):
        return {}
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", _DPKG_FORMAT, *patterns],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    # Exit status 1 only says that some pattern matched nothing; the rest is still listed.
    return parse_dpkg_packages(out.stdout)


def runtime_identity(backend: str) -> dict[str, Any]:
    """Backend libraries beyond the Python module's version that an artefact depends on
    (part of the cache key when not empty): TensorRT's Debian packages."""
    if backend == "tensorrt":
        packages = dpkg_packages(*TENSORRT_DPKG_PATTERNS)
        return {"packages": packages} if packages else {}
    return {}


def jetson_identity(root: Path | None = None) -> dict[str, Any] | None:
    """Jetson module, L4T and JetPack (stgcnd/board.py), or None off a Jetson."""
    board = detect(root)
    if not board.jetson:
        return None
    info: dict[str, Any] = {"module": board.model, "l4t": board.l4t}
    if root is None:
        packages = dpkg_packages("nvidia-l4t-core", "nvidia-jetpack")
        for key, name in (("l4t_core", "nvidia-l4t-core"), ("jetpack", "nvidia-jetpack")):
            if packages.get(name):
                info[key] = packages[name]
    return info


def _gpu_from_torch() -> dict[str, Any] | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
        return {"name": torch.cuda.get_device_name(0), "compute_capability": f"{major}.{minor}"}
    except Exception:
        return None


def parse_nvidia_smi(text: str) -> dict[str, Any] | None:
    """First line of `nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader`."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if "," not in line:
        return None
    name, cc = (s.strip() for s in line.rsplit(",", 1))
    return {"name": name, "compute_capability": cc}


def _gpu_from_nvidia_smi() -> dict[str, Any] | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap",
                              "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi(out.stdout) if out.returncode == 0 else None


@lru_cache(maxsize=1)
def gpu_identity() -> dict[str, Any] | None:
    """GPU 0's name and compute capability, or None without a usable GPU."""
    return _gpu_from_torch() or device_properties() or _gpu_from_nvidia_smi()


def cuda_identity() -> dict[str, Any]:
    """A CUDA device's part of the cache key beyond its architecture: GPU + Jetson."""
    gpu = gpu_identity()
    ident = {"gpu": gpu["name"] if gpu else None,
             "compute_capability": gpu["compute_capability"] if gpu else None}
    jetson = jetson_identity()
    return {**ident, "jetson": jetson} if jetson else ident


def device_slug(identity: dict[str, Any]) -> str:
    """A file-name-safe tag of a device: 'cpu-x86_64', 'cuda-sm87-orin'."""
    if identity.get("kind") != "cuda":
        return f"cpu-{identity.get('machine', 'unknown')}"
    cc = str(identity.get("compute_capability") or "unknown").replace(".", "")
    gpu = re.sub(r"[^a-z0-9]+", "-", str(identity.get("gpu") or "gpu").lower()).strip("-")
    return f"cuda-sm{cc}-{gpu}"[:80]
