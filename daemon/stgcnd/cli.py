"""The `stgcnd` command line: one entry point, one module per subcommand.

Each command's module (the daemon's in `stgcnd.commands`, the tools' in the `stgcnd_tools`
package beside it) exposes `register(subparsers)`, which adds its parser and sets `func`. Only
the module of the command being run is imported (`stgcnd serve` loads the daemon and nothing
of the tools); `stgcnd --help` imports them all to list them. The global options
(--log-level, --log-format) are accepted before or after the command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from stgcnd import __version__
from stgcnd.errors import UserError
from stgcnd.log import configure_logging
from stgcnd.versions import torch_missing

# command -> its module; the order here is the order in `stgcnd --help`.
COMMANDS = {
    "serve": "stgcnd.commands.serve",
    "config": "stgcnd.commands.config",
    "docs": "stgcnd.commands.docs",
    "demo": "stgcnd_tools.commands.demo",
    "camera-sim": "stgcnd_tools.commands.camera_sim",
    "loadtest": "stgcnd_tools.commands.loadtest",
    "example": "stgcnd_tools.commands.example",
    "export": "stgcnd.commands.export",
    "build": "stgcnd.commands.build",
    "validate": "stgcnd.commands.validate",
    "engines": "stgcnd.commands.engines",
    "bench": "stgcnd_tools.commands.bench",
    "doctor": "stgcnd.commands.doctor",
    "tegrastats": "stgcnd_tools.commands.tegrastats",
    "logs": "stgcnd_tools.commands.logs",
    "keys": "stgcnd.commands.keys",
    "trtexec": "stgcnd_tools.commands.trtexec",
}
LOG_LEVELS = ["debug", "info", "warning", "error"]
LOG_FORMATS = ["auto", "json", "console"]


def _global_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """--log-level and --log-format; on a subcommand they default to nothing, so that the
    value given before the command (or the top level's default) stands unless repeated."""
    p.add_argument("--log-level", choices=LOG_LEVELS,
                   default=None if defaults else argparse.SUPPRESS,
                   help="log level of the structured log (default: serve takes [server] "
                        "log_level from its config, other commands info)")
    p.add_argument("--log-format", choices=LOG_FORMATS,
                   default="auto" if defaults else argparse.SUPPRESS,
                   help="log format; auto = console on a terminal, JSON lines otherwise "
                        "(default: auto)")


class _Commands(argparse._SubParsersAction):
    """Subcommands that take the global options too."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser = super().add_parser(name, **kwargs)
        _global_options(parser, defaults=False)
        return parser


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with `only` that one (whose module alone is
    imported)."""
    parser = argparse.ArgumentParser(
        prog="stgcnd",
        description="On-device inference daemon for two-stream ST-GCN action recognition.")
    parser.add_argument("--version", action="version", version=f"stgcnd {__version__}")
    _global_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", action=_Commands)
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).register(sub)
    return parser


def command_in(argv: Sequence[str]) -> str | None:
    """The subcommand named in argv, if any (global options' values are never commands)."""
    return next((a for a in argv if a in COMMANDS), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(command_in(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # Commands that own stdout for their results log to stderr; `serve` logs to stdout.
    log_stream = sys.stdout if getattr(args, "log_to_stdout", False) else sys.stderr
    configure_logging(args.log_level or "info", args.log_format, stream=log_stream)
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
        print(f"stgcnd {args.command}: error: {torch_missing('this')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"stgcnd {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
