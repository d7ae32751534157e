"""`stgcnd serve`: the daemon (what systemd runs).

A fatal error is a structured log event like everything else the daemon says
(`startup_failed` before it serves, `daemon_failed` after), so journald readers filtering on
JSON fields see it. The human one-liner goes to stderr too, unless the log is JSON and stderr
is not a terminal (under systemd both streams land in the journal: every line stays JSON).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stgcnd.errors import BuildCancelled, UserError
from stgcnd.log import configure_logging, get_logger, log_is_json
from stgcnd.server.config import Config, load_config
from stgcnd.server.config_checks import check_config
from stgcnd.server.notify import Notifier
from stgcnd.server.server import Server, startup_cancelled
from stgcnd.server.transport import check_endpoint
from stgcnd.server.wakeup import Wakeup

STARTUP_HINT = ("fix what the error names, then start the daemon again "
                "(systemctl restart stgcnd)")
BUG_HINT = ("this is a bug in stgcnd: report it with this log and the output of "
            "`stgcnd doctor`")


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


def report_fatal(event: str, exc: BaseException) -> int:
    """Log `event` for a fatal error (and print the one-liner where a human reads it)."""

    log = get_logger("stgcnd.serve")
    if isinstance(exc, UserError):
        code = exc.exit_code
        log.error(event, error=str(exc), error_type=type(exc).__name__,
                  hint=exc.hint or STARTUP_HINT, exit_code=code)
    else:
        code = 1
        log.error(event, error=str(exc) or type(exc).__name__, error_type=type(exc).__name__,
                  hint=BUG_HINT, exit_code=code, exc_info=exc)
    if not log_is_json() or sys.stderr.isatty():
        print(f"stgcnd serve: error: {exc}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:

    try:
        overrides = {"endpoint": args.endpoint,
                     "engines_dir": str(args.engines) if args.engines else None,
                     "stats_interval": args.stats_interval}

        def reread() -> Config:  # a reload keeps the flags' values, as the start had them
            return load_config(args.config, overrides=overrides, flag_names=FLAG_NAMES)

        config = reread()
        # Before any model is loaded or built: what `stgcnd config check` checks, then
        # whether the endpoint is free to listen on now (which a check before a reload,
        # with the daemon listening there, cannot ask).
        if args.log_level is None:  # no --log-level: the config's [server] log_level
            configure_logging(config.server.log_level, args.log_format, stream=sys.stdout)
        check_config(config)
        check_endpoint(config.endpoint)
        wakeup, notifier = Wakeup(), Notifier()
        wakeup.install_signal_handlers()
        server = Server(config, wakeup, notifier, reread,
                        follow_log_level=args.log_level is None)
    except BuildCancelled:
        return startup_cancelled(notifier)
    except Exception as exc:
        return report_fatal("startup_failed", exc)
    try:
        return server.serve()
    except Exception as exc:
        return report_fatal("daemon_failed", exc)
