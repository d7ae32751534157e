"""Run a command with a directory truly read-only for it, root or not.

As root, chmod does not stop writes (CAP_DAC_OVERRIDE), so the command runs in its own mount
namespace (`unshare -m`, private propagation: the host's mounts are untouched) with the
directory bind-mounted onto itself read-only: writes fail with EROFS, as on a read-only
root filesystem. As another user, chmod a-w gives EACCES. Where neither is possible the
caller skips.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

_MOUNT_RO = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'


def _unshare_works(probe: Path) -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["unshare", "-m", "sh", "-c", _MOUNT_RO, str(probe), "sh", "-c",
                        f"touch {probe}/x"], capture_output=True, text=True)
    return r.returncode != 0 and "Read-only file system" in r.stderr


@contextmanager
def read_only(directory: Path) -> Iterator[list[str]]:
    """Yields the argv prefix that runs a command with `directory` read-only."""
    if os.geteuid() != 0:
        modes = {}
        for p in [directory, *directory.rglob("*")]:
            if p.is_dir():
                modes[p] = p.stat().st_mode
                p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
        try:
            yield []
        finally:
            for p, mode in modes.items():
                p.chmod(stat.S_IMODE(mode))
        return
    if not _unshare_works(directory.parent / ".ro-probe"):
        pytest.skip("running as root without mount namespaces: no way to make a directory "
                    "read-only for this process")
    yield ["unshare", "-m", "sh", "-c", _MOUNT_RO, str(directory)]


def prefixed(prefix: Sequence[str], argv: Sequence[str]) -> list[str]:
    return [*prefix, *argv]
