"""Versions of the libraries an artefact depends on, for manifests and `stgcnd doctor`."""

from __future__ import annotations

import importlib
import importlib.metadata
import platform
import re
import sys

from stgcnd import __version__

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
