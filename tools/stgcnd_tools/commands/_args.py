"""What several tool commands share: the camera options (demo, camera-sim), reading a file
or stdin (logs, tegrastats)."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from typing import ContextManager, TextIO

from stgcnd.errors import UserError


def add_camera_args(p: argparse.ArgumentParser) -> None:
    """--cameras, --fps, --mode and --timeout, with the same meaning and defaults
    everywhere."""
    p.add_argument("--cameras", type=int, default=4,
                   help="simulated cameras, one client thread each (default: 4)")
    p.add_argument("--fps", type=float, default=25.0,
                   help="frames per second per camera (default: 25)")
    p.add_argument("--mode", choices=["window", "push"], default="push",
                   help="push: one frame per request, the daemon keeps each camera's window; "
                        "window: a full window per request (default: push)")
    p.add_argument("--timeout", type=float, default=5.0,
                   help="seconds each camera waits for the answer to a frame or window, "
                        "retries included (the client's `timeout`; default: 5)")


def check_timeout(seconds: float) -> None:
    """--timeout: a finite number of seconds > 0, or one line saying so (exit 2)."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise UserError(f"--timeout must be a number of seconds > 0, got {seconds:g}")


def open_input(path: str, what: str) -> ContextManager[TextIO]:
    """`path` to read, or stdin for "-" (left open); one line when it cannot be read (exit
    2), ending with `what` to do."""
    if path == "-":
        return contextlib.nullcontext(sys.stdin)
    try:
        return open(path, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}; {what}") from None
