"""Options shared by the commands that simulate cameras (demo, camera-sim)."""

from __future__ import annotations

import argparse
import math

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
