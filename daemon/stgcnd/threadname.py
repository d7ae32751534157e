"""Name the calling OS thread, so `top -H`, py-spy and /proc show which thread is which.

Python before 3.14 names only its own Thread objects; the kernel sees every thread under the
process's name. Linux keeps 15 bytes of a thread name (PR_SET_NAME); elsewhere this does
nothing.
"""

from __future__ import annotations

import ctypes
import sys

_PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Best effort: a failure (not Linux, no libc) leaves the name as it was."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode("utf-8", "replace")[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass
