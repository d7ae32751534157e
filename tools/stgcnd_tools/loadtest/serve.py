"""`--serve`: a daemon of the load test's own, on a temporary ipc endpoint, stopped at the end.

The daemon is `python -m stgcnd serve` in a subprocess (the same interpreter and code as this
command), configured by a TOML file we write, or by the user's (`--serve-config`), whose
endpoint we override. Stopping: SIGTERM to its pid, a bounded wait, then SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stgcnd.errors import UserError
from stgcnd_client import Client, ClientError

STOP_TIMEOUT_S = 30.0
# Camera slots beyond the load test's own: the control client and a margin.
EXTRA_CAMERAS = 8


@dataclass(frozen=True)
class ServeOptions:
    backend: str = "noop"
    frames: int = 150
    persons: int = 1
    checkpoint: Path | None = None
    precision: str = "fp32"
    device: str = "auto"
    max_batch: int = 0               # 0: the daemon's default (auto)
    config: Path | None = None        # the user's TOML instead of ours (endpoint overridden)
    engines: Path | None = None
    log_path: Path | None = None
    ready_timeout: float = 300.0      # a first start may build engines (minutes)


def write_config(path: Path, opts: ServeOptions, model: str, cameras: int) -> Path:
    lines = ["[server]", "stats_interval = 10.0",
             f"max_cameras = {max(64, cameras + EXTRA_CAMERAS)}",
             "", "[[models]]", f'name = "{model}"', f'backend = "{opts.backend}"',
             f"frames = {opts.frames}", f"persons = {opts.persons}",
             f'precision = "{opts.precision}"', f'device = "{opts.device}"',
             f"max_batch = {opts.max_batch}"]
    if opts.checkpoint is not None:
        lines.append(f'checkpoint = "{Path(opts.checkpoint).resolve()}"')
    else:
        lines.append("demo = true")  # serving the demo model must be explicit
    path.write_text("\n".join(lines) + "\n")
    return path


def _die_with_parent() -> None:
    """In the daemon child: SIGTERM when the load test dies, so no daemon is left behind."""
    try:
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: ServedDaemon.stop still runs from the load test's finally-block


class ServedDaemon:
    """A daemon subprocess; use as a context manager, or call start() then stop()."""

    def __init__(self, opts: ServeOptions, model: str = "loadtest", cameras: int = 0) -> None:
        self.opts = opts
        self.tmp = Path(tempfile.mkdtemp(prefix="stgcnd-loadtest-"))
        self.endpoint = f"ipc://{self.tmp / 'stgcnd.sock'}"
        self.log_path = opts.log_path or self.tmp / "daemon.log"
        self.config_path = opts.config or write_config(self.tmp / "loadtest.toml", opts, model,
                                                       cameras)
        if not self.config_path.is_file():
            raise UserError(f"--serve-config {self.config_path} not found")
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> ServedDaemon:
        cmd = [sys.executable, "-m", "stgcnd", "--log-format", "json", "serve", "--config",
               str(self.config_path), "--endpoint", self.endpoint]
        if self.opts.engines is not None:
            cmd += ["--engines", str(self.opts.engines)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        end = time.monotonic() + self.opts.ready_timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise UserError(f"the daemon exited during start-up (code "
                                f"{self.proc.returncode}); its log {self.log_path} ends with: "
                                f"{self.log_tail()}")
            try:
                with Client(self.endpoint, camera_id="loadtest-probe", timeout=1.0,
                            retries=0) as c:
                    c.ping()
                    return
            except ClientError:
                time.sleep(0.2)
        raise UserError(f"the daemon did not answer within {self.opts.ready_timeout:.0f} s; "
                        f"see {self.log_path}")

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty)"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.returncode = proc.returncode
        return self.returncode

    def describe(self) -> dict[str, Any]:
        o = self.opts
        return {"pid": self.pid, "endpoint": self.endpoint, "config": str(self.config_path),
                "log": str(self.log_path), "backend": None if o.config else o.backend,
                "exit_code": self.returncode}

    def __enter__(self) -> ServedDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
