"""`stgcnd demo`: the daemon on the demo model plus simulated cameras, in one command."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.errors import UserError
from stgcnd_tools.commands._args import add_camera_args, check_timeout
from stgcnd_tools.daemon import DaemonProcess
from stgcnd_tools.demo.camera_sim import simulate
from stgcnd_tools.demo.event_printer import EventPrinter
from stgcnd_tools.demo.progress import LogFollower, describe
from stgcnd_tools.demo.report import (
    LEGEND,
    Load,
    Outcome,
    events_line,
    explain_rate,
    prediction_verdict,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="start the daemon on the demo model and simulate cameras",
                       description="Start `stgcnd serve` on the embedded default (demo model, "
                                   "CPU backend, a temporary ipc endpoint), run simulated 25 fps "
                                   "cameras against it with a live table, then stop it cleanly. "
                                   "The demo model's predictions mean nothing.")
    add_camera_args(p)
    p.add_argument("--duration", type=float, default=20.0,
                   help="seconds the cameras run, after the daemon is ready (default: 20)")
    p.add_argument("--stride", type=int, default=25,
                   help="push mode: one prediction every N frames (default: 25 = 1 per second)")
    p.add_argument("--engines", type=Path, default=None, help="engine store directory")
    p.add_argument("--daemon-log", type=Path, default=None,
                   help="write the daemon's JSON log here (default: a temp file)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.cameras < 1 or args.fps <= 0 or args.duration <= 0 or args.stride < 1:
        raise UserError("--cameras and --stride must be >= 1, --fps and --duration > 0")
    check_timeout(args.timeout)
    tmp = Path(tempfile.mkdtemp(prefix="stgcnd-demo-"))
    endpoint = f"ipc://{tmp / 'stgcnd.sock'}"
    log_path = args.daemon_log or tmp / "daemon.log"
    # One prediction per camera per second (stride 25 at 25 fps): what a 2-core CPU sustains
    # for several cameras; a Jetson with TensorRT serves stride 1.
    config = tmp / "demo.toml"
    events_endpoint = f"ipc://{tmp / 'events.sock'}"
    config.write_text(demo_config(args.stride, events_endpoint))
    printer = EventPrinter(events_endpoint, _say)
    log_path.write_bytes(b"")  # the start-up steps shown are this run's
    daemon = DaemonProcess(config, log_path, endpoint=endpoint, engines=args.engines)
    _say("demo model: random weights, its predictions mean nothing")
    _say(f"starting the daemon on {endpoint} (the first start exports, builds and validates "
        "the model: up to a minute on a small CPU; later starts reuse it)")
    _say(f"  command: {' '.join(daemon.command())}\n  log: {log_path}")
    t0 = time.monotonic()
    follower = LogFollower(log_path)

    def progress() -> None:  # each start-up step from the daemon's log, as it happens
        for line in filter(None, map(describe, follower.events())):
            print(f"[{time.monotonic() - t0:5.1f} s] {line}", file=sys.stderr, flush=True)

    rows: list[dict[str, object]] = []
    timing: dict[str, float] = {}
    with daemon:
        try:
            daemon.wait_ready(300.0, progress)
            timing["startup"] = time.monotonic() - t0
            _say(f"start-up took {timing['startup']:.1f} s. Clients connect to {endpoint}; "
                 f"events are published on {events_endpoint}")
            printer.start()
            printer.wait_subscribed()
            every = (f"a prediction every {args.stride} frames" if args.mode == "push"
                     else "a prediction per frame")
            _say(f"running {args.cameras} simulated cameras at {args.fps:g} fps for "
                 f"{args.duration:g} s ({args.mode} mode, {every}) ...")
            t1 = time.monotonic()
            rows = simulate(endpoint, args.cameras, args.fps, args.mode, args.duration,
                            legend=LEGEND, timeout=args.timeout)
            timing["cameras"] = time.monotonic() - t1
        finally:
            t2 = time.monotonic()
            daemon.stop()
            timing["shutdown"] = time.monotonic() - t2
            if printer.is_alive():
                printer.finish()
    # The verdict comes from what came back: replies at the camera's rate without a single
    # prediction are a failed demo, however fast they were.
    outcome = _outcome(rows)
    verdict = prediction_verdict(outcome, args.timeout, args.fps, args.duration,
                                 push=args.mode == "push")
    if verdict is not None:
        _say(verdict)
    else:
        for line in _rate_lines(rows, args):
            _say(line)
    _say(f"daemon stopped (exit code {daemon.returncode}); log: {log_path}")
    _say(events_line(printer.started_events, printer.ended_reasons, outcome.predictions))
    _say("took " + ", ".join(f"{k} {v:.1f} s" for k, v in timing.items())
        + f"; summarize the log: stgcnd logs summarize {log_path}")
    if outcome.overload and verdict is None:
        _say(f"{outcome.overload} request(s) expired or were refused as busy in the daemon's "
             "queue: the CPU was saturated at times (counted in `errors`); every camera still got "
             "predictions")
    return 0 if daemon.returncode == 0 and outcome.failures == 0 and verdict is None else 1


def _outcome(rows: list[dict[str, Any]]) -> Outcome:
    busy = sum(int(count) for row in rows
               for cause, count in dict(row.get("error_causes") or {}).items()
               if str(cause).startswith("the daemon answered busy"))
    expired = sum(int(r.get("expired", 0)) for r in rows)
    timed_out = sum(int(r.get("timed_out", 0)) for r in rows)
    errors = sum(int(r["errors"]) for r in rows)
    return Outcome(cameras=len(rows), predictions=sum(int(r["predictions"]) for r in rows),
                   without_predictions=tuple(str(r["camera"]) for r in rows
                                             if not r["predictions"]),
                   expired=expired, timed_out=timed_out, busy=busy,
                   other_errors=errors - expired - timed_out - busy)


def demo_config(stride: int = 25, events_endpoint: str = "") -> str:
    """The daemon configuration the demo serves (tests/test_readme.py serves it too), with
    action events published on `events_endpoint` when given."""
    text = (f'[server]\nstats_interval = 5.0\nevents_endpoint = "{events_endpoint}"\n\n'
            f'[[models]]\nname = "demo"\ndemo = true\nstride = {stride}\n')
    # The demo model's random weights put every window in its second class (probability
    # ~1.0): each camera's event starts after min_duration_s and ends at the shutdown.
    return text + ("\n[models.events]\nmin_duration_s = 1.0\n" if events_endpoint else "")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _rate_lines(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """Did the cameras keep their rate, and if not, why (numbers from the run)."""
    rates = [r["rate_hz"] or 0.0 for r in rows]
    computes = [r["compute_ms"] for r in rows if r.get("compute_ms") is not None]
    latencies = [r["p50_ms"] for r in rows if r.get("p50_ms") is not None]
    per_camera = args.fps if args.mode == "window" else args.fps / args.stride
    load = Load(cameras=len(rows), fps=args.fps, windows_per_s=per_camera * len(rows),
                compute_ms=float(np.median(computes)) if computes else None,
                achieved_hz=float(np.mean(rates)),
                latency_ms=float(np.median(latencies)) if latencies else None,
                duration_s=args.duration)
    return explain_rate(load)
