"""Versions of the libraries an artefact depends on, for manifests and `stgcnd doctor`."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from stgcnd import __version__
from stgcnd.board import detect

TORCH_FLOOR = (2, 0)   # the [torch] extra's floor; CI runs the suite on torch 2.0.1
TORCH_FIX = ('pip install -e ".[torch]" (or pip install "stgcnd[torch]"); on a machine '
             "without an NVIDIA GPU install the CPU build first (pip install torch "
             "--index-url https://download.pytorch.org/whl/cpu), else pip takes a 2.7 GB CUDA "
             "build; on a Jetson, NVIDIA's torch wheel for your JetPack first (JetPack 5.1: "
             "2.0 or 2.1; docs/jetson.md)")


def torch_missing(what: str) -> str:
    """The one message for something that needs torch where it is not installed."""
    return f"{what} needs PyTorch, which is not installed: {TORCH_FIX}"


def torch_unusable(version: str | None = None) -> str | None:
    """None when this torch is recent enough for stgcnd, else why not and the fix. `version`
    (as installed, e.g. NVIDIA's "2.0.0+nv23.05") defaults to the installed torch's, read
    from its metadata, not by importing it (seconds)."""
    if version is None:
        try:
            version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:  # not installed, or a source tree
            return None
    leading = [re.split(r"\D", part, maxsplit=1)[0] for part in version.split(".")[:2]]
    if tuple(int(d or 0) for d in leading) < TORCH_FLOOR:
        return (f"torch {version} is older than {TORCH_FLOOR[0]}.{TORCH_FLOOR[1]}, the oldest "
                f"stgcnd supports: {TORCH_FIX}")
    return None


def module_version(name: str) -> str | None:
    try:
        mod = importlib.import_module(name)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "unknown"))


def tool_versions(*extra: str) -> dict[str, str | None]:

    names = ("numpy", "torch", "onnx", *extra)
    return {"stgcnd": __version__, "python": platform.python_version(),
            **{n: module_version(n) for n in names}, "platform": sys.platform}


# --- the Jetson software stack (for `stgcnd doctor`) ------------------------------------------
#
# Every reader takes the filesystem root (tests use a directory of real-format files), and the
# dpkg database is read from var/lib/dpkg/status instead of running dpkg-query.

# L4T major -> JetPack line and the Python its Ubuntu ships (JetPack's tensorrt bindings are
# built for that Python only). Sources in docs/jetson.md.
JETPACK_BY_L4T_MAJOR = {35: ("5", "3.8"), 36: ("6", "3.10"), 38: ("7", "3.12"),
                        39: ("7", "3.12")}


def dpkg_versions(status_text: str, packages: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of `packages` from a dpkg status database (var/lib/dpkg/status)."""
    found: dict[str, str] = {}
    for stanza in status_text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        name = fields.get("Package")
        if name in packages and "installed" in fields.get("Status", "").split():
            found[name] = fields.get("Version", "")
    return found


def parse_nvcc_version(text: str) -> str | None:
    """'Cuda compilation tools, release 11.4, V11.4.315' -> '11.4.315'."""
    m = re.search(r"release\s+[0-9.]+,\s*V([0-9.]+)", text or "")
    return m.group(1) if m else None


def cuda_toolkit_version(root: Path = Path("/")) -> tuple[str | None, str]:
    """(version, where it was read) of the CUDA toolkit under usr/local/cuda."""
    cuda = root / "usr" / "local" / "cuda"
    try:
        data = json.loads((cuda / "version.json").read_text())
        return str(data["cuda"]["version"]), str(cuda / "version.json")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    nvcc = cuda / "bin" / "nvcc"
    if nvcc.exists():
        try:
            out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                                 timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        return parse_nvcc_version(out), str(nvcc)
    return None, str(cuda)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode(errors="replace").replace("\x00", "")
    except OSError:
        return None


def jetson_stack(root: Path = Path("/"), python: str | None = None,
                 modules: dict[str, str | None] | None = None) -> dict[str, Any] | None:
    """What a Jetson has for stgcnd, and what is missing with the fix; None off a Jetson.

    `python` ('3.8') and `modules` ({'tensorrt': '8.5.2.2' or None}) default to this
    interpreter's; tests pass them with a `root` of real-format files.
    """
    board = detect(root)
    if not board.jetson:
        return None
    python = python or platform.python_version()
    if modules is None:
        modules = {"tensorrt": module_version("tensorrt")}
    packages = dpkg_versions(_read_text(root / "var" / "lib" / "dpkg" / "status") or "",
                             ("nvidia-jetpack", "nvidia-l4t-core", "tensorrt",
                              "python3-libnvinfer", "cuda-toolkit", "libcudnn8", "libcudnn9"))
    l4t = (int(board.l4t.split(".")[0]), board.l4t) if board.l4t else None
    line = JETPACK_BY_L4T_MAJOR.get(l4t[0]) if l4t else None
    cuda, cuda_source = cuda_toolkit_version(root)
    out: dict[str, Any] = {
        "module": board.model or None,
        "l4t": board.l4t,
        "l4t_core": packages.get("nvidia-l4t-core"),
        "jetpack": packages.get("nvidia-jetpack") or (f"{line[0]}.x (from L4T)" if line
                                                      else None),
        "tensorrt_package": packages.get("tensorrt") or packages.get("python3-libnvinfer"),
        "tensorrt_python": modules.get("tensorrt"),
        "cuda": cuda, "cuda_source": cuda_source, "python": python, "problems": [],
    }
    problems: list[dict[str, str]] = out["problems"]
    if l4t is None:
        problems.append({"what": "L4T release unknown (/etc/nv_tegra_release unreadable)",
                         "fix": "check the board was flashed with JetPack (SDK Manager)"})
    elif line is None:
        problems.append({"what": f"L4T R{l4t[0]} is not a JetPack stgcnd knows (5, 6, 7)",
                         "fix": "JetPack 5.1.x (R35), 6.x (R36) or 7.x (R38/R39)"})
    want_python = line[1] if line else None
    if line and want_python and not python.startswith(want_python + ".") and python != want_python:
        problems.append({
            "what": f"Python {python}, but JetPack {line[0]}'s tensorrt bindings are built for "
                    f"Python {want_python}",
            "fix": f"make the venv from the system interpreter: python{want_python} -m venv "
                   "--system-site-packages /opt/stgcnd/venv"})
    if not out["tensorrt_python"]:
        if out["tensorrt_package"]:
            problems.append({
                "what": f"TensorRT {out['tensorrt_package']} is installed but not importable "
                        "from this Python",
                "fix": "recreate the venv with --system-site-packages (JetPack's tensorrt "
                       "lives in /usr/lib/python3/dist-packages)"})
        else:
            problems.append({"what": "TensorRT is not installed",
                             "fix": "sudo apt install nvidia-jetpack (or python3-libnvinfer)"})
    return out
