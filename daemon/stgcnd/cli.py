"""The `stgcnd` command line: one entry point, one module per subcommand.

Each module in `stgcnd.commands` exposes `register(subparsers)`, which adds its parser and sets
`func`. Command modules import their heavy dependencies (torch, onnxruntime, tensorrt) inside
`func`, so `stgcnd --help` stays fast and works without them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from stgcnd import __version__
from stgcnd.errors import UserError

# Order here is the order in `stgcnd --help`.
COMMAND_MODULES = (
    "stgcnd.commands.serve",
    "stgcnd.commands.demo",
    "stgcnd.commands.camera_sim",
    "stgcnd.commands.loadtest",
    "stgcnd.commands.export",
    "stgcnd.commands.build",
    "stgcnd.commands.validate",
    "stgcnd.commands.engines",
    "stgcnd.commands.bench",
    "stgcnd.commands.doctor",
    "stgcnd.commands.tegrastats",
    "stgcnd.commands.logs",
    "stgcnd.commands.trtexec",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stgcnd",
        description="On-device inference daemon for two-stream ST-GCN action recognition.",
    )
    parser.add_argument("--version", action="version", version=f"stgcnd {__version__}")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"],
                        help="log level of the structured log (default: info)")
    parser.add_argument("--log-format", default="auto", choices=["auto", "json", "console"],
                        help="log format; auto = console on a terminal, JSON lines otherwise "
                             "(default: auto)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command not written yet in this checkout
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from stgcnd.log import configure_logging

    # Commands that own stdout for their results log to stderr; `serve` logs to stdout.
    log_stream = sys.stdout if getattr(args, "log_to_stdout", False) else sys.stderr
    configure_logging(args.log_level, args.log_format, stream=log_stream)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"stgcnd {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        # torch is optional: a command (or option) that needs it says what to install in one
        # line instead of a traceback. Anything else missing is a broken install: re-raise.
        if (exc.name or "").split(".")[0] != "torch":
            raise
        from stgcnd.model.reference import torch_missing

        print(f"stgcnd {args.command}: error: {torch_missing('this')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"stgcnd {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
