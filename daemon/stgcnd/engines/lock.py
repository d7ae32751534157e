"""One builder per artefact across processes: an flock on a lock file beside the artefact.

flock locks belong to the open file description, so the kernel drops them when the holder
dies (even by SIGKILL): a killed build never leaves a stale lock behind. The holder's pid is
written into the file only to say who is waiting for whom.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from stgcnd.errors import UserError
from stgcnd.log import get_logger

log = get_logger(__name__)


@contextmanager
def build_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if needed); waits for another holder."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"cannot create the lock file {path}: {exc.strerror}; make the engine "
                        "store writable or pass --engines DIR on a writable disk") from None
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
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the pid is informational only (e.g. a full disk)
        yield
    finally:
        os.close(fd)  # releases the flock
