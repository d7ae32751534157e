"""Crash-safe file writes (a reader sees the old file or the complete new one, never a part),
and tolerant reads of the small system files the doctor and the board checks look at."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by name; one that is gone or cannot be opened is skipped
    (the caller's durability is best effort past that point)."""
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
    tmp = new_temp_file(path)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def new_temp_file(path: Path) -> Path:
    """An empty file beside `path`, made with the permissions any new file gets (0666 less
    the umask: 0644 under the usual 022), not mkstemp's 0600: exported models, engines and
    reports are read by other users (the daemon's, a colleague's). The writer's pid in the
    name: a killed writer's leftovers can be found and removed (`stgcnd engines prune`, a
    cancelled build) without touching a live writer's file."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}.{secrets.token_hex(4)}.part"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name beside {path}")


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
