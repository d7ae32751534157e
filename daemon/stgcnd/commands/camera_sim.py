"""`stgcnd camera-sim`: drive a running daemon with simulated cameras."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("camera-sim", help="simulate cameras against a running daemon",
                       description="Run N simulated 25 fps cameras (synthetic skeletons) "
                                   "against a daemon and print per-camera latency.")
    p.add_argument("--endpoint", required=True, help="the daemon's endpoint")
    p.add_argument("--cameras", type=int, default=4)
    p.add_argument("--fps", type=float, default=25.0)
    p.add_argument("--mode", choices=["window", "push"], default="push",
                   help="push: one frame per request (server-side window); window: full "
                        "windows (default: push)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds (default: 20)")
    p.add_argument("--model", default=None, help="model name (default: the daemon's default)")
    p.add_argument("--json", action="store_true", help="print the final rows as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from stgcnd.demo.camera_sim import simulate

    rows = simulate(args.endpoint, args.cameras, args.fps, args.mode, args.duration, args.model)
    if args.json:
        print(json.dumps(rows))
    return 1 if any(r["errors"] for r in rows) else 0
