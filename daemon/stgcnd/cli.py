"""The `stgcnd` command line: one entry point, one module per subcommand.

Each command's module exposes `register(subparsers)`, which adds its parser and sets `func`.
The daemon's commands are listed here; the tools' are declared by the tools package itself
(`COMMANDS` in the package named by `TOOLS`), which this module imports by that one name where
it is installed: the daemon names no tool. Only the module of the command being run is
imported (`stgcnd serve` loads the daemon and nothing of the tools); `stgcnd --help` imports
them all to list them. The global options (--log-level, --log-format) are accepted before or
after the command.
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

# The daemon's commands: command -> its module, in the order of `stgcnd --help`.
COMMANDS = {
    "serve": "stgcnd.commands.serve",
    "config": "stgcnd.commands.config",
    "export": "stgcnd.commands.export",
    "build": "stgcnd.commands.build",
    "validate": "stgcnd.commands.validate",
    "engines": "stgcnd.commands.engines",
    "keys": "stgcnd.commands.keys",
}
# The package that declares the tools' commands: its COMMANDS maps each to (its module, the
# command it follows in `stgcnd --help`). It comes with the same distribution as the daemon;
# the daemon serves without it.
TOOLS = "stgcnd_tools"
TOOLS_MISSING = (
    "the tools' commands (the doctor, the generated docs, the demo, camera simulator, load "
    "test, benchmarks, log and tegrastats summaries, trtexec runs) are not installed here, as "
    "the stgcnd_tools package is missing: install stgcnd from its repository with `pip "
    "install .` (or `pip install -e .`), which installs the daemon and its tools together")
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


def tool_commands() -> dict[str, tuple[str, str]] | None:
    """The tools' commands as their package declares them; None where it is not installed."""
    try:
        tools = importlib.import_module(TOOLS)
    except ModuleNotFoundError as exc:
        if exc.name != TOOLS:
            raise  # the package is there but broken: a traceback says where
        return None
    return dict(tools.COMMANDS)


def all_commands() -> dict[str, str]:
    """Every command -> its module, in the order of `stgcnd --help`: the daemon's, each tool's
    after the command its package says it follows (at the end if that one is not here)."""
    order, modules = list(COMMANDS), dict(COMMANDS)
    for name, (module, after) in (tool_commands() or {}).items():
        if name not in modules:
            order.insert(order.index(after) + 1 if after in order else len(order), name)
            modules[name] = module
    return {name: modules[name] for name in order}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with `only` that one (whose module alone is
    imported; for a daemon command the tools package is not even looked for)."""
    parser = argparse.ArgumentParser(
        prog="stgcnd",
        description="On-device inference daemon for two-stream ST-GCN action recognition.")
    parser.add_argument("--version", action="version", version=f"stgcnd {__version__}")
    _global_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", action=_Commands)
    table = COMMANDS if only in COMMANDS else all_commands()
    for name, module in table.items():
        if only is None or name == only:
            importlib.import_module(module).register(sub)
    if only is None and tool_commands() is None:
        parser.epilog = f"{TOOLS_MISSING[0].upper()}{TOOLS_MISSING[1:]}."
    return parser


def command_in(argv: Sequence[str]) -> str | None:
    """The word of argv in the command's place: the first that is neither an option nor a
    global option's value (it may name no command)."""
    words = iter(argv)
    for word in words:
        if word in ("--log-level", "--log-format"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = command_in(argv)
    if command is not None and command not in COMMANDS:
        tools = tool_commands()
        if tools is None:
            print(f"stgcnd: {command!r} is not a command of the daemon, and {TOOLS_MISSING}",
                  file=sys.stderr)
            return 2
        if command not in tools:
            command = None  # argparse names the choices
    parser = build_parser(command)
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
