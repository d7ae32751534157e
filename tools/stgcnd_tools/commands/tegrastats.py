"""`stgcnd tegrastats parse [FILE|-]`: existing tegrastats logs as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stgcnd.log import get_logger
from stgcnd.telemetry.tegrastats import parse_line
from stgcnd_tools.commands._args import open_input


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tegrastats", help="tools for tegrastats output",
        description="Tools for tegrastats output from any Jetson generation.")
    sub = parser.add_subparsers(dest="tegrastats_command", metavar="ACTION", required=True)
    parse = sub.add_parser(
        "parse", help="one JSON object per tegrastats line",
        description="Parse tegrastats lines (a log written with `tegrastats --logfile`, or a "
                    "pipe) into one JSON object per line. Unparseable lines give "
                    '{"ok": false, "error": ...} and do not stop the run.')
    parse.add_argument("file", nargs="?", default="-", metavar="FILE",
                       help="tegrastats output to read; - (default) reads stdin")
    parse.set_defaults(func=run_parse)


def run_parse(args: argparse.Namespace) -> int:
    lines = unparsed = 0
    with open_input(args.file, "pass a tegrastats log file, or - for stdin") as stream:
        for raw in filter(str.strip, stream):
            result: dict[str, Any] = parse_line(raw)
            lines += 1
            unparsed += 0 if result.get("ok") else 1
            sys.stdout.write(json.dumps(result) + "\n")
    if unparsed:
        get_logger(__name__).warning("tegrastats_unparsed_lines", lines=lines, unparsed=unparsed)
    return 0
