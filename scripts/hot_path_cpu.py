"""The daemon's CPU per request, code trees side by side in one run (issue #44).

    python3 scripts/hot_path_cpu.py old=/tmp/old-hot new=. [--trials 3] [--processes 2]
        [--cameras 32] [--rate 25] [--seconds 10] [--profile]

Each tree (a checkout, or `git archive main daemon clients tools | tar -x -C DIR`) serves a
noop model (`stgcnd loadtest --serve`'s configuration) while this checkout's load test sends
P processes x K cameras at RATE windows a second; the trees take turns, trial after trial, so
that a noisy machine charges them alike, and the bare ZeroMQ echo (scripts/zmq_echo_floor.py)
is measured at the same load once per trial. Prints each run's daemon CPU per request (its own
stats, docs/performance.md) and the echo's. `--profile` runs each daemon under cProfile over
the measured interval instead and prints Python function calls per request (the profiler
slows the daemon: its CPU figures are not comparable, so none is printed).
"""

from __future__ import annotations

import argparse
import os
import pstats
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for package_dir in ("daemon", "clients", "tools"):
    sys.path.insert(0, str(ROOT / package_dir))

from stgcnd_client import Client  # noqa: E402
from stgcnd_tools.daemon import DaemonProcess  # noqa: E402
from stgcnd_tools.loadtest import echo_floor  # noqa: E402
from stgcnd_tools.loadtest.plan import LoadPlan  # noqa: E402
from stgcnd_tools.loadtest.runner import run_load  # noqa: E402
from stgcnd_tools.loadtest.serve import ServeOptions, write_config  # noqa: E402

# The daemon under a profiler that runs only between SIGUSR1 and SIGUSR2 (signal handlers run
# on the main thread, which is the I/O loop's): start-up and imports are not counted.
PROFILED = """
import cProfile, signal, sys
prof, path = cProfile.Profile(), sys.argv.pop(1)
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
def dump(*_):
    prof.disable()
    prof.dump_stats(path)
signal.signal(signal.SIGUSR2, dump)
from stgcnd.cli import main
raise SystemExit(main())
"""


class TreeDaemon(DaemonProcess):
    """`python -m stgcnd serve` from another tree's code (optionally under PROFILED)."""

    def __init__(self, tree: Path, tmp: Path, cameras: int, profile: Path | None) -> None:
        config = write_config(tmp / "hot.toml", ServeOptions(), "hot", cameras)
        env = {**os.environ, "PYTHONPATH": f"{tree / 'daemon'}:{tree / 'clients'}"}
        super().__init__(config, tmp / "daemon.log", endpoint=f"ipc://{tmp / 'hot.sock'}",
                         env=env)
        self.profile = profile

    def command(self) -> list[str]:
        cmd = super().command()
        if self.profile is None:
            return cmd
        return [sys.executable, "-c", PROFILED, str(self.profile), *cmd[3:]]


def requests_read(endpoint: str) -> int:
    with Client(endpoint, camera_id="hot-control", timeout=5.0) as c:
        return int(c.stats()["requests"])


def one_run(tree: Path, args: argparse.Namespace) -> float:
    """Daemon CPU us/request, or (profiled) Python calls per request."""
    with tempfile.TemporaryDirectory(prefix="hot-") as tmp_dir:
        tmp = Path(tmp_dir)
        profile = tmp / "loop.prof" if args.profile else None
        daemon = TreeDaemon(tree, tmp, args.processes * args.cameras, profile)
        with daemon:
            daemon.wait_ready(60.0)
            plan = LoadPlan(str(daemon.endpoint), processes=args.processes,
                            cameras=args.cameras, rate_hz=args.rate, duration=args.seconds,
                            warmup=2.0, model="hot")
            if profile is None:
                report = run_load(plan, served_pid=daemon.pid)
                return float(report["daemon_cpu"]["us_per_request"])
            load = threading.Thread(target=run_load, args=(plan, daemon.pid))
            load.start()
            time.sleep(plan.warmup + 3.0)  # the load processes' spawn, then its warm-up
            first = requests_read(plan.endpoint)
            os.kill(daemon.pid, signal.SIGUSR1)
            time.sleep(args.seconds - 4.0)
            os.kill(daemon.pid, signal.SIGUSR2)
            served = requests_read(plan.endpoint) - first
            load.join()
            while not profile.exists():
                time.sleep(0.1)
        calls = pstats.Stats(str(profile)).total_calls  # type: ignore[attr-defined]
        if args.top:
            pstats.Stats(str(profile)).sort_stats("tottime").print_stats(args.top)
        if args.keep:
            shutil.copy(profile, Path(args.keep) / f"{tree.name}-{time.time():.0f}.prof")
        return calls / served


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trees", nargs="+", metavar="NAME=DIR", help="code trees to compare")
    p.add_argument("--trials", type=int, default=3, help="runs of each tree (default: 3)")
    p.add_argument("--processes", type=int, default=2, help="load processes (default: 2)")
    p.add_argument("--cameras", type=int, default=32, help="cameras each (default: 32)")
    p.add_argument("--rate", type=float, default=25.0, help="Hz per camera (default: 25)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured s (default: 10)")
    p.add_argument("--profile", action="store_true", help="calls per request, not CPU")
    p.add_argument("--top", type=int, default=0, help="--profile: print the N costliest")
    p.add_argument("--keep", default=None, metavar="DIR", help="--profile: keep each profile")
    args = p.parse_args()
    trees = {name: Path(d).resolve() for name, d in (t.split("=", 1) for t in args.trees)}
    unit = "calls/request" if args.profile else "CPU us/request"
    results: dict[str, list[float]] = {name: [] for name in trees}
    floors: list[float] = []
    for trial in range(args.trials):
        if not args.profile:
            floor = echo_floor.measure(args.processes, args.cameras, args.rate, args.seconds)
            floors.append(floor.echo_cpu_us_per_request or float("nan"))
            print(f"trial {trial}: echo floor {floors[-1]:.1f} CPU us/request", flush=True)
        for name, tree in trees.items():
            results[name].append(one_run(tree, args))
            print(f"trial {trial}: {name} {results[name][-1]:.1f} {unit}", flush=True)
    print(f"{args.processes} x {args.cameras} cameras at {args.rate:g} Hz, {args.trials} "
          f"trials, median (all):")
    if floors:
        print(f"  echo floor: {statistics.median(floors):.1f} "
              f"({', '.join(f'{f:.1f}' for f in floors)})")
    for name, values in results.items():
        print(f"  {name}: {statistics.median(values):.1f} {unit} "
              f"({', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
