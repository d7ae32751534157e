"""`stgcnd camera-sim`: drive a running daemon with simulated cameras."""

from __future__ import annotations

import argparse
import json

from stgcnd.errors import UserError
from stgcnd.server.transport import parse_endpoint
from stgcnd_tools.commands._args import add_camera_args, check_timeout
from stgcnd_tools.demo.camera_sim import simulate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "camera-sim", help="simulate cameras against a running daemon",
        description="Run N simulated cameras (synthetic skeletons, through the real client "
                    "library) against a running daemon and print per-camera latency. Exits 1 "
                    "if any request failed, with one line per cause on stderr.")
    p.add_argument("--endpoint", required=True,
                   help="the daemon's endpoint, as `stgcnd serve` logs it in its \"ready\" line "
                        "(ipc:///path/to/socket or tcp://host:port); required")
    add_camera_args(p)
    p.add_argument("--duration", type=float, default=20.0,
                   help="seconds to run (default: 20)")
    p.add_argument("--model", default=None,
                   help="model name to request (default: the daemon's default model)")
    p.add_argument("--json", action="store_true", help="also print the final rows as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    parse_endpoint(args.endpoint, listening=False)  # a malformed endpoint: one line, exit 2
    if args.cameras < 1 or args.fps <= 0 or args.duration <= 0:
        raise UserError("--cameras must be >= 1, --fps and --duration > 0")
    check_timeout(args.timeout)
    rows = simulate(args.endpoint, args.cameras, args.fps, args.mode, args.duration, args.model,
                    timeout=args.timeout)
    if args.json:
        print(json.dumps(rows))
    return 1 if any(r["errors"] for r in rows) else 0
