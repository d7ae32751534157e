"""`stgcnd tegrastats parse [FILE|-]`: existing tegrastats logs as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stgcnd.errors import UserError
from stgcnd.log import get_logger
from stgcnd.telemetry.tegrastats import parse_line


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
    log = get_logger(__name__)
    stream = _open(args.file)
    lines = unparsed = 0
    try:
        for raw in stream:
            if not raw.strip():
                continue
            result: dict[str, Any] = parse_line(raw)
            lines += 1
            unparsed += 0 if result.get("ok") else 1
            sys.stdout.write(json.dumps(result) + "\n")
    finally:
        if stream is not sys.stdin:
            stream.close()
    if unparsed:
        log.warning("tegrastats_unparsed_lines", lines=lines, unparsed=unparsed)
    return 0


def _open(path: str) -> Any:
    if path == "-":
        return sys.stdin
    try:
        return open(path, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}; "
                        "pass a tegrastats log file, or - for stdin") from None
