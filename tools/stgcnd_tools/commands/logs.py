"""`stgcnd logs summarize`: per-camera latency and GPU state from the daemon's JSON logs;
`stgcnd logs plot`: the operator's timeline of events (and the latency figure)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stgcnd.errors import UserError
from stgcnd_tools.commands._args import open_input
from stgcnd_tools.logs.plot import plot
from stgcnd_tools.logs.summarize import parse_time, render_text, scan, summarize
from stgcnd_tools.logs.timeline import plot_events


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "logs", help="read the daemon's structured logs",
        description="Read the daemon's JSON log lines (e.g. `journalctl -u stgcnd -o cat`).")
    sub = parser.add_subparsers(dest="logs_command", metavar="ACTION", required=True)
    summ = sub.add_parser(
        "summarize", help="latency per camera and model, with GPU load/clock/temperature/power",
        description="Summarize `latency`, `system` and `request` events: request counts, "
                    "latency percentiles over the whole span and per interval, error/busy/"
                    "expired rates, and GPU load, frequency, temperature and power ranges. "
                    "Lines that are not stgcnd JSON are skipped and counted. Example: "
                    "journalctl -u stgcnd -o cat | stgcnd logs summarize --camera cam3 "
                    "--since 30m --plot cam3.png")
    summ.add_argument("file", nargs="?", default="-", metavar="FILE",
                      help="log file to read; - (default) reads stdin")
    summ.add_argument("--camera", metavar="ID", help="only this camera's latency/request events")
    summ.add_argument("--since", metavar="TIME",
                      help="start: ISO-8601 (UTC when no zone) or an age like 10m, 2h, 1d")
    summ.add_argument("--until", metavar="TIME", help="end: same forms as --since")
    summ.add_argument("--plot", metavar="OUT.png",
                      help="also draw latency percentiles over time with GPU load and "
                           "temperature (needs matplotlib: pip install 'stgcnd[plots]')")
    summ.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    summ.set_defaults(func=run_summarize)
    drawn = sub.add_parser(
        "plot", help="figures: the events timeline per camera, latency apart",
        description="Draw the log as figures (needs matplotlib: pip install 'stgcnd[plots]'). "
                    "--events: one row per camera, a bar per action event coloured by class "
                    "from the alarm (the start message) to its end, ends by a shutdown or "
                    "crash marked, feed states under each row. --latency: the latency and "
                    "machine figure of `summarize --plot`. Example: journalctl -u stgcnd "
                    "-o cat --since today | stgcnd logs plot --events today.png --local-time")
    drawn.add_argument("file", nargs="?", default="-", metavar="FILE",
                       help="log file to read; - (default) reads stdin")
    drawn.add_argument("--events", metavar="OUT.png", help="write the events timeline here")
    drawn.add_argument("--latency", metavar="OUT.png", help="write the latency figure here")
    drawn.add_argument("--local-time", action="store_true",
                       help="the events' time axis in this machine's time zone (TZ), not UTC")
    drawn.add_argument("--camera", metavar="ID", help="only this camera")
    drawn.add_argument("--since", metavar="TIME",
                       help="start: ISO-8601 (UTC when no zone) or an age like 10m, 2h, 1d")
    drawn.add_argument("--until", metavar="TIME", help="end: same forms as --since")
    drawn.set_defaults(func=run_plot)


def _time(value: str | None, flag: str) -> Any:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise UserError(f"{flag} {value!r} is not a time; use ISO-8601 such as "
                        "2025-06-01T14:00:00Z or an age such as 10m, 2h, 1d") from None


def _scan(args: argparse.Namespace) -> Any:
    since = _time(args.since, "--since")
    until = _time(args.until, "--until")
    if since and until and since > until:
        raise UserError("--since is after --until; swap them")
    with open_input(args.file, "pass a log file or pipe `journalctl -u stgcnd -o cat` into "
                    "it") as stream:
        return scan(stream, args.camera, since, until)


def run_plot(args: argparse.Namespace) -> int:
    if not args.events and not args.latency:
        raise UserError("say which figure: --events OUT.png, --latency OUT.png or both")
    log = _scan(args)
    title = f"stgcnd: camera {args.camera}" if args.camera else None
    if args.events:
        out = plot_events(log, args.events, title, args.local_time)
        sys.stdout.write(f"events timeline written to {out}\n")
    if args.latency:
        sys.stdout.write(f"latency figure written to {plot(log, args.latency, title)}\n")
    return 0


def run_summarize(args: argparse.Namespace) -> int:
    log = _scan(args)
    summary = summarize(log)
    if args.plot:
        title = f"stgcnd: camera {args.camera}" if args.camera else None
        summary["plot"] = str(plot(log, args.plot, title))
    if args.json:
        sys.stdout.write(json.dumps(summary) + "\n")
    else:
        sys.stdout.write(render_text(summary))
        if args.plot:
            sys.stdout.write(f"plot written to {summary['plot']}\n")
    return 0
