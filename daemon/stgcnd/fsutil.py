"""Crash-safe file writes (a reader sees the old file or the complete new one, never a part),
and tolerant reads of the small system files the doctor and the board checks look at."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call write(tmp) on a temp file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # The writer's pid in the name: a killed writer's leftovers can be found and removed
    # (`stgcnd engines prune`, a cancelled build) without touching a live writer's file.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}.", suffix=".part",
                                    dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def file_sha256(path: Path | str, chunk: int = 1 << 20) -> str:
    """sha256 of a file, read in chunks (checkpoints and engines can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_system_file(path: Path) -> str | None:
    """A small system file's text (sysfs, /proc, /etc), stripped; NUL bytes (device-tree
    strings end in one) dropped and undecodable bytes replaced; None when it cannot be read."""
    try:
        return path.read_bytes().decode(errors="replace").replace("\x00", "").strip()
    except OSError:
        return None


def parse_int(text: str | None) -> int | None:
    """`text` as an int, or None (missing or not a number)."""
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
