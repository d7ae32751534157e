"""`stgcnd loadtest`: P processes x K simulated cameras against a daemon (our perf_analyzer)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from stgcnd.errors import UserError
from stgcnd_tools.loadtest import echo_floor
from stgcnd_tools.loadtest.daemon_cpu import is_local
from stgcnd_tools.loadtest.plan import DEFAULT_RATE_HZ, LoadPlan
from stgcnd_tools.loadtest.report import format_table, has_failures
from stgcnd_tools.loadtest.runner import run_load
from stgcnd_tools.loadtest.scenarios import (
    SCENARIOS,
    Scenario,
    describe_load,
    format_verdicts,
    missed,
    verdicts,
)
from stgcnd_tools.loadtest.serve import ServedDaemon, ServeOptions

# Load options a scenario sets itself (argparse dests), with their defaults without one:
# given with --scenario they would be ignored, so they are refused. argparse's defaults are
# None, to tell a flag given from one left alone; rate and closed_loop resolve in _plan.
LOAD_DEFAULTS = {"processes": 1, "cameras": 4, "mode": "window", "rate": None,
                 "closed_loop": None, "duration": 10.0, "warmup": 2.0, "join": 0,
                 "join_at": None, "join_window": 5.0}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "loadtest", help="measure a daemon under load: P processes x K cameras",
        description="Drive a daemon with P processes x K simulated cameras (threads, each with "
                    "its own stgcnd_client.Client), open loop at a rate or closed loop, in window "
                    "or push mode, optionally with cameras joining mid-run. Prints windows/s, "
                    "round-trip percentiles, the server's own timings, overhead (round trip "
                    "minus compute), errors and the daemon's CPU time per request; --json "
                    "writes all of it. --serve starts a daemon of its own (e.g. --backend noop, "
                    "which measures the daemon itself on any machine).")
    target = p.add_argument_group("target")
    target.add_argument("--endpoint", default=None,
                        help="the daemon's endpoint (required unless --serve)")
    target.add_argument("--model", default=None, help="model name (default: the daemon's "
                                                      "default model)")
    target.add_argument("--server-key", default=None, metavar="KEY",
                        help="CURVE: the daemon's public key, a file or z85 (`stgcnd keys "
                             "server`); with --client-key, for a daemon with curve on")
    target.add_argument("--client-key", default=None, metavar="KEY",
                        help="CURVE: the cameras' key pair, a NAME.key_secret file (`stgcnd "
                             "keys create`); unbound to camera ids: the load's ids are made up")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default=None,
                   help="a named load and its goals (docs/performance.md); it sets the load "
                        "options below itself (giving one is an error), measures the bare "
                        "ZeroMQ floor at the same load first where a goal needs it, prints "
                        "whether each goal was met, and exits 1 when one was missed: "
                        + "; ".join(f"{s.name}: {s.what}" for s in SCENARIOS.values()))
    load = p.add_argument_group("load (without --scenario)")
    load.add_argument("--processes", type=int, default=None, help="load processes (default: 1)")
    load.add_argument("--cameras", type=int, default=None,
                      help="cameras per process from the start (default: 4)")
    load.add_argument("--mode", choices=["window", "push"], default=None,
                      help="window: a full window per request; push: one frame per request, "
                           "the server keeps the window (default: window)")
    loop = load.add_mutually_exclusive_group()
    loop.add_argument("--rate", type=float, default=None, metavar="HZ",
                      help="open loop: requests per second per camera on a fixed schedule "
                           "(default: 25)")
    loop.add_argument("--closed-loop", action="store_true", default=None,
                      help="send the next request as soon as the reply arrives")
    load.add_argument("--duration", type=float, default=None,
                      help="measured seconds (default: 10)")
    load.add_argument("--warmup", type=float, default=None,
                      help="seconds of load before measuring, excluded from stats (default: 2)")
    load.add_argument("--join", type=int, default=None, metavar="N",
                      help="N extra cameras that join during the measured interval")
    load.add_argument("--join-at", type=float, default=None, metavar="S",
                      help="second of the measured interval at which they join (default: "
                           "its middle)")
    load.add_argument("--join-window", type=float, default=None, metavar="S",
                      help="the running cameras' errors are reported separately for S seconds "
                           "from the join (default: 5)")
    load.add_argument("--timeout-ms", type=float, default=5000.0,
                      help="a reply later than this is lost (no retries; default: 5000)")
    load.add_argument("--seed", type=int, default=0, help="synthetic skeleton seed")
    out = p.add_argument_group("output")
    out.add_argument("--json", default=None, metavar="PATH",
                     help="write the full report as JSON to PATH (- for stdout; the table then "
                          "goes to stderr)")
    out.add_argument("--fail-on-errors", action="store_true",
                     help="exit 1 when any request got an error or no reply")
    serve = p.add_argument_group("--serve: a daemon of its own on a temporary ipc endpoint")
    serve.add_argument("--serve", action="store_true",
                       help="start `stgcnd serve`, wait for it, run, stop it")
    serve.add_argument("--backend", default="noop",
                       help="the served model's backend (default: noop)")
    serve.add_argument("--frames", type=int, default=150, help="window length T (default: 150)")
    serve.add_argument("--persons", type=int, default=1, help="person slots M (default: 1)")
    serve.add_argument("--checkpoint", type=Path, default=None,
                       help="checkpoint to serve (default: the demo model)")
    serve.add_argument("--precision", default="fp32", help="default: fp32")
    serve.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    serve.add_argument("--max-batch", type=int, default=0,
                       help="largest batch across cameras (default: 0, the daemon's own "
                            "default: 64 on a GPU, 16 on a CPU; 1 turns batching off)")
    serve.add_argument("--serve-config", dest="config", type=Path, default=None, metavar="TOML",
                       help="serve this configuration instead (its endpoint is replaced)")
    serve.add_argument("--engines", type=Path, default=None, help="engine store directory")
    serve.add_argument("--daemon-log", dest="log_path", type=Path, default=None,
                       help="write the daemon's log here (default: a temp file)")
    p.set_defaults(func=run)


def check_options(args: argparse.Namespace) -> None:
    """Refuse what this run could not honour, before anything starts."""
    if args.scenario:
        given = ["--" + dest.replace("_", "-") for dest in LOAD_DEFAULTS
                 if getattr(args, dest) is not None]
        if given:
            scenario = SCENARIOS[args.scenario]
            raise UserError(f"--scenario {scenario.name} sets the load itself "
                            f"({describe_load(scenario.load)}), so {', '.join(given)} would be "
                            f"ignored; drop {'them' if len(given) > 1 else 'it'}, or drop "
                            "--scenario to choose the load yourself (no goals are judged then)")
    if args.serve and args.endpoint:
        raise UserError("--serve starts its own daemon on a temporary endpoint; drop --endpoint "
                        "(or drop --serve to test a running daemon)")
    if not args.serve and not args.endpoint:
        raise UserError("give --endpoint of a running daemon, or --serve to start one")


def _plan(args: argparse.Namespace, endpoint: str) -> LoadPlan:
    if args.scenario:
        load = SCENARIOS[args.scenario].load
    else:
        load = {k: d if getattr(args, k) is None else getattr(args, k)
                for k, d in LOAD_DEFAULTS.items() if k not in ("rate", "closed_loop")}
        load["rate_hz"] = (None if args.closed_loop else DEFAULT_RATE_HZ if args.rate is None
                           else args.rate)
    return LoadPlan(endpoint=endpoint, model=args.model, timeout_ms=args.timeout_ms,
                    seed=args.seed, server_key=args.server_key, client_key=args.client_key,
                    **load)


def floor_measure(scenario: Scenario | None, plan: LoadPlan
                  ) -> Callable[[], dict[str, Any]] | None:
    """What measures the scenario's floor (the bare ZeroMQ echo at its load), or None when no
    goal needs one. It runs once the daemon answers, before the load."""
    if scenario is None or not scenario.floor_s:
        return None
    rate = plan.rate_hz
    if rate is None:  # no scenario with a floor is closed loop; a plain guard
        return None

    def measure() -> dict[str, Any]:
        if not is_local(plan.endpoint):
            return {"note": f"the daemon ({plan.endpoint}) is on another machine: an echo here "
                            "would not be its floor"}
        transport = "tcp" if plan.endpoint.startswith("tcp://") else "ipc"
        print(f"measuring the floor first: bare ZeroMQ {transport} echo at the same load "
              f"({plan.processes} x {plan.cameras} camera(s) at {rate:g} Hz) for "
              f"{scenario.floor_s:g} s", file=sys.stderr, flush=True)
        floor = echo_floor.measure(plan.processes, plan.cameras, rate, scenario.floor_s,
                                   transport=transport).to_dict()
        if plan.server_key:
            floor["without"] = "CURVE (the daemon's goal is judged against plain ZeroMQ)"
        return floor

    return measure


def _emit(report: dict[str, Any], json_path: str | None) -> None:
    table_out = sys.stderr if json_path == "-" else sys.stdout
    print(format_table(report), file=table_out, flush=True)
    if json_path is None:
        return
    text = json.dumps(report, indent=2, allow_nan=False)
    if json_path == "-":
        print(text, flush=True)
    else:
        Path(json_path).write_text(text + "\n")
        print(f"report: {json_path}", file=table_out, flush=True)


def run(args: argparse.Namespace) -> int:
    check_options(args)
    scenario = SCENARIOS[args.scenario] if args.scenario else None
    if not args.serve:
        plan = _plan(args, args.endpoint)
        report = run_load(plan, floor=floor_measure(scenario, plan))
    else:
        plan_check = _plan(args, "ipc://placeholder")  # bad load options fail before a start
        opts = ServeOptions(**{f.name: getattr(args, f.name) for f in fields(ServeOptions)
                               if f.name in vars(args)})
        daemon = ServedDaemon(opts, model=args.model or "loadtest",
                              cameras=plan_check.total_cameras)
        print(f"starting daemon ({opts.backend if opts.config is None else opts.config}); "
              f"log: {daemon.log_path}", file=sys.stderr, flush=True)
        with daemon:
            plan = _plan(args, str(daemon.endpoint))
            report = run_load(plan, served_pid=daemon.pid, served=daemon.describe(),
                              floor=floor_measure(scenario, plan))
        report["served"] = daemon.describe()  # now with the daemon's exit code
        if daemon.returncode != 0:
            print(f"warning: the daemon exited with code {daemon.returncode}; see "
                  f"{daemon.log_path}", file=sys.stderr, flush=True)
    if scenario is not None:
        rows = verdicts(scenario, report)
        report["scenario"] = {"name": scenario.name, "goals": rows}
    _emit(report, args.json)
    if scenario is not None:
        print(f"scenario {scenario.name}:\n" + format_verdicts(report["scenario"]["goals"]),
              file=sys.stderr if args.json == "-" else sys.stdout, flush=True)
        if missed(report["scenario"]["goals"]):
            return 1
    if args.fail_on_errors and has_failures(report):
        return 1
    return 0
