"""`stgcnd demo`: the daemon on the demo model plus simulated cameras, in one command."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stgcnd.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="start the daemon on the demo model and simulate cameras",
                       description="Start `stgcnd serve` on the embedded default (demo model, "
                                   "CPU backend, a temporary ipc endpoint), run simulated 25 fps "
                                   "cameras against it with a live table, then stop it cleanly. "
                                   "The demo model's predictions mean nothing.")
    p.add_argument("--cameras", type=int, default=4,
                   help="simulated cameras, one client thread each (default: 4)")
    p.add_argument("--duration", type=float, default=20.0,
                   help="seconds the cameras run, after the daemon is ready (default: 20)")
    p.add_argument("--mode", choices=["window", "push"], default="push",
                   help="push: one frame per request, the daemon keeps each camera's window; "
                        "window: a full window per request (default: push)")
    p.add_argument("--fps", type=float, default=25.0,
                   help="frames per second per camera (default: 25)")
    p.add_argument("--stride", type=int, default=25,
                   help="push mode: one prediction every N frames (default: 25 = 1 per second)")
    p.add_argument("--engines", type=Path, default=None, help="engine store directory")
    p.add_argument("--daemon-log", type=Path, default=None,
                   help="write the daemon's JSON log here (default: a temp file)")
    p.set_defaults(func=run)


def wait_ready(endpoint: str, proc: subprocess.Popen, timeout: float) -> None:
    from stgcnd_client import Client, ClientError

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise UserError(f"the daemon exited during start-up (code {proc.returncode}); "
                            "see its log")
        try:
            with Client(endpoint, camera_id="demo-probe", timeout=1.0, retries=0) as c:
                c.ping()
                return
        except ClientError:
            time.sleep(0.2)
    raise UserError(f"the daemon did not answer within {timeout:.0f} s")


def _die_with_parent() -> None:
    """In the daemon child: get SIGTERM if `stgcnd demo` dies, so no daemon is left behind."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the demo's own finally-block still stops the daemon


def run(args: argparse.Namespace) -> int:
    from stgcnd.demo.camera_sim import simulate

    tmp = Path(tempfile.mkdtemp(prefix="stgcnd-demo-"))
    endpoint = f"ipc://{tmp / 'stgcnd.sock'}"
    log_path = args.daemon_log or tmp / "daemon.log"
    # One prediction per camera per second (stride 25 at 25 fps): what a 2-core CPU sustains
    # for several cameras; a Jetson with TensorRT serves stride 1.
    config = tmp / "demo.toml"
    config.write_text(f'[server]\nstats_interval = 5.0\n\n[[models]]\nname = "demo"\n'
                      f'demo = true\nstride = {args.stride}\n')
    cmd = [sys.executable, "-m", "stgcnd", "--log-format", "json", "serve", "--config",
           str(config), "--endpoint", endpoint]
    if args.engines:
        cmd += ["--engines", str(args.engines)]
    print("demo model: random weights, its predictions mean nothing", file=sys.stderr)
    print(f"starting daemon: {' '.join(cmd)}\n  log: {log_path}", file=sys.stderr)
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        try:
            wait_ready(endpoint, proc, timeout=300.0)
            rows = simulate(endpoint, args.cameras, args.fps, args.mode, args.duration)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    print(f"daemon stopped (exit code {proc.returncode}); log: {log_path}", file=sys.stderr)
    print(f"summarize it: stgcnd logs summarize {log_path}", file=sys.stderr)
    errors = sum(int(r["errors"]) for r in rows)  # type: ignore[call-overload]
    return 0 if proc.returncode == 0 and errors == 0 else 1
