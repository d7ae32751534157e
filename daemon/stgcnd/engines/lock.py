"""One builder per artefact across processes: an flock on a lock file beside the artefact.

The kernel drops an flock when its holder dies, so a killed build never leaves a stale lock.
A store this process cannot write still serves its current artefacts (flock needs no write
access), and a build there is refused with one clear line.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stgcnd.errors import UserError
from stgcnd.log import get_logger

log = get_logger(__name__)

# What "cannot write here" looks like: a read-only mount, permissions, an immutable inode.
READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})

_read_only_logged: set[str] = set()  # one engine_store_read_only line per directory


def _open_lock(path: Path) -> tuple[int | None, OSError | None]:
    """(fd, None) with a writable lock file; (fd or None, why) on a read-only store."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644), None
    except OSError as exc:
        if exc.errno not in READ_ONLY_ERRNOS:
            raise UserError(f"cannot create the lock file {path}: {exc.strerror}; make the "
                            "engine store writable or pass --engines DIR on a writable disk"
                            ) from None
        why = exc
    try:
        return os.open(path, os.O_RDONLY), why
    except OSError:
        return None, why


@contextmanager
def build_lock(path: Path, what: str) -> Iterator[bool]:
    """Hold an exclusive lock on `path` (created if needed); waits for another holder.

    Yields True when the store is writable here, False when it is read-only for this
    process (then the lock is held on the existing file read-only, or not at all): the
    caller may reuse current artefacts but must not build.
    """
    fd, read_only = _open_lock(path)
    if read_only is not None and str(path.parent) not in _read_only_logged:
        _read_only_logged.add(str(path.parent))
        log.info("engine_store_read_only", lock=str(path), error=read_only.strerror,
                 locked=fd is not None, action="current artefacts are reused without writing")
    if fd is None:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            log.info("engine_build_wait", what=what, lock=str(path), holder_pid=holder)
            t0 = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            log.info("engine_build_wait_done", what=what,
                     waited_s=round(time.monotonic() - t0, 3))
        if read_only is None:
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:
                pass  # the pid is informational only (e.g. a full disk)
        yield read_only is None
    finally:
        os.close(fd)  # releases the flock
