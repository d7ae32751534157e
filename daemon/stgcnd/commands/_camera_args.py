"""Options shared by the commands that simulate cameras (demo, camera-sim)."""

from __future__ import annotations

import argparse


def add_camera_args(p: argparse.ArgumentParser) -> None:
    """--cameras, --fps and --mode, with the same meaning and defaults everywhere."""
    p.add_argument("--cameras", type=int, default=4,
                   help="simulated cameras, one client thread each (default: 4)")
    p.add_argument("--fps", type=float, default=25.0,
                   help="frames per second per camera (default: 25)")
    p.add_argument("--mode", choices=["window", "push"], default="push",
                   help="push: one frame per request, the daemon keeps each camera's window; "
                        "window: a full window per request (default: push)")
