"""Find the trtexec executable: an explicit path, then PATH, then /usr/src/tensorrt/bin
(JetPack, Debian packages) and /opt/tensorrt/bin (NGC containers).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from stgcnd.errors import UserError

JETPACK_TRTEXEC = Path("/usr/src/tensorrt/bin/trtexec")
DEFAULT_LOCATIONS: tuple[Path, ...] = (JETPACK_TRTEXEC, Path("/opt/tensorrt/bin/trtexec"))


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_trtexec(explicit: str | Path | None = None, *, search_path: str | None = None,
                 locations: Sequence[Path] = DEFAULT_LOCATIONS) -> Path | None:
    """The trtexec to run, or None when there is none.

    `explicit` must exist (UserError otherwise: the user named it). `search_path` replaces
    $PATH for the lookup; `locations` are tried after PATH.
    """
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not _is_executable(path):
            raise UserError(f"--trtexec {path}: not an executable file; point it at the trtexec "
                            f"binary, e.g. {JETPACK_TRTEXEC}")
        return path.resolve()
    on_path = shutil.which("trtexec", path=search_path)
    if on_path:
        return Path(on_path).resolve()
    for candidate in locations:
        if _is_executable(candidate):
            return candidate
    return None


def require_trtexec(explicit: str | Path | None = None, *, search_path: str | None = None,
                    locations: Sequence[Path] = DEFAULT_LOCATIONS) -> Path:
    found = find_trtexec(explicit, search_path=search_path, locations=locations)
    if found is None:
        tried = ", ".join(str(p) for p in locations)
        raise UserError(
            f"trtexec not found on PATH nor at {tried}. It ships with TensorRT: on Jetson it "
            f"comes with JetPack (apt install nvidia-jetpack, or tensorrt) as {JETPACK_TRTEXEC}; "
            f"put it on PATH (export PATH=$PATH:{JETPACK_TRTEXEC.parent}) or pass "
            "--trtexec PATH")
    return found
