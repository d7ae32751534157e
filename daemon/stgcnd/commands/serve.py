"""`stgcnd serve`: the daemon (what systemd runs)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the inference daemon",
                       description="Serve per-camera inference over ZeroMQ. Configuration: "
                                   "--config, else $STGCND_CONFIG, else /etc/stgcnd/stgcnd.toml "
                                   "if present, else the demo model on a local ipc endpoint. "
                                   "STGCND_<KEY> variables override [server] keys.")
    p.add_argument("--config", type=Path, default=None, help="TOML configuration file")
    p.add_argument("--endpoint", default=None,
                   help="override [server] endpoint: ipc:///path/to/socket or tcp://host:port "
                        "(checked before any model loads; default: [server] endpoint, else "
                        "stgcnd.sock in $XDG_RUNTIME_DIR/stgcnd or /tmp/stgcnd-UID/stgcnd; the "
                        "\"ready\" log event names it)")
    p.add_argument("--engines", type=Path, default=None, help="override [server] engines_dir")
    p.add_argument("--stats-interval", type=float, default=None,
                   help="override [server] stats_interval (seconds)")
    p.set_defaults(func=run, log_to_stdout=True)


# [server] key -> the flag that overrides it, so that a bad value's error names the flag.
FLAG_NAMES = {"endpoint": "--endpoint", "engines_dir": "--engines",
              "stats_interval": "--stats-interval"}


def run(args: argparse.Namespace) -> int:
    from stgcnd.server.config import load_config
    from stgcnd.server.transport import check_endpoint

    config = load_config(args.config, overrides={
        "endpoint": args.endpoint,
        "engines_dir": str(args.engines) if args.engines else None,
        "stats_interval": args.stats_interval}, flag_names=FLAG_NAMES)
    # Before any model is loaded or built: a wrong endpoint fails now, with a fix.
    check_endpoint(config.endpoint)
    from stgcnd.server.server import run_server

    return run_server(config, args.config)
