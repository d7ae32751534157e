"""The one way the tools and the tests run a daemon: `python -m stgcnd serve` as a child
process (this interpreter, this code), ready once it answers the client's ping, stopped by
its pid with SIGTERM, a bounded wait, then SIGKILL."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from stgcnd.errors import UserError
from stgcnd_client import Client, ClientError

STOP_TIMEOUT_S = 30.0


def stop(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM to the pid we started, up to `timeout` s for it to exit, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    return proc.returncode


class DaemonProcess:
    """`args`: global stgcnd flags; `serve_args`: serve's own; `prefix`: an argv in front of
    the interpreter (a test's read-only mount); `fd_limit`: the child's RLIMIT_NOFILE."""

    def __init__(self, config: Path, log_path: Path, *, endpoint: str | None = None,
                 engines: Path | None = None, args: Sequence[str] = (),
                 serve_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, cwd: Path | None = None,
                 prefix: Sequence[str] = (),
                 fd_limit: int | None = None) -> None:
        self.config, self.log_path, self.endpoint = config, log_path, endpoint
        self.engines, self.args, self.cwd = engines, list(args), cwd
        self.serve_args = list(serve_args)
        self.env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
        self.prefix, self.fd_limit = list(prefix), fd_limit
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    def command(self) -> list[str]:
        cmd = [*self.prefix, sys.executable, "-m", "stgcnd", "--log-format", "json", *self.args,
               "serve", "--config", str(self.config), *self.serve_args]
        cmd += ["--endpoint", self.endpoint] if self.endpoint else []
        return cmd + (["--engines", str(self.engines)] if self.engines else [])

    def _in_child(self) -> None:
        if self.fd_limit:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.fd_limit, self.fd_limit))
        try:  # SIGTERM when our process dies, so that no daemon is left behind
            pr_set_pdeathsig = 1
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
        except (OSError, AttributeError):
            pass  # not Linux: stop() still runs from the caller's finally-block

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> DaemonProcess:
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=self.cwd, preexec_fn=self._in_child)
        return self

    def wait_ready(self, timeout: float, progress: Callable[[], None] = lambda: None) -> None:
        """Until the daemon answers a ping (`progress` runs between tries); UserError when it
        exits first or does not answer within `timeout` s."""
        assert self.proc is not None and self.endpoint is not None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            progress()
            if self.proc.poll() is not None:
                progress()
                raise UserError(f"the daemon exited during start-up (code "
                                f"{self.proc.returncode}); its log {self.log_path} ends with: "
                                f"{self.log_tail()}")
            try:
                with Client(self.endpoint, camera_id="probe", timeout=0.5, retries=0) as c:
                    c.ping()
                progress()
                return
            except ClientError:
                time.sleep(0.2)
        raise UserError(f"the daemon did not answer within {timeout:.0f} s; see {self.log_path}")

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(text[-lines:]) or "(empty)"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        if self.proc is not None:
            self.returncode = stop(self.proc, timeout)
        return self.returncode

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
