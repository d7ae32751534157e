"""Versions of the libraries an artefact depends on, for manifests and `stgcnd doctor`."""

from __future__ import annotations

import importlib
import platform
import sys


def module_version(name: str) -> str | None:
    try:
        mod = importlib.import_module(name)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "unknown"))


def tool_versions(*extra: str) -> dict[str, str | None]:
    from stgcnd import __version__

    names = ("numpy", "torch", "onnx", *extra)
    return {"stgcnd": __version__, "python": platform.python_version(),
            **{n: module_version(n) for n in names}, "platform": sys.platform}
