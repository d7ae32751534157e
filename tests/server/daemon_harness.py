"""Start the real daemon as a subprocess on an ipc endpoint in a temp dir, with a real
datagram socket standing in for systemd's NOTIFY_SOCKET.

A daemon made with `reuse_engines=True` starts on a copy of the engine store that an earlier
such daemon with the same [[models]] built (once it was ready), instead of an empty one: the
store still decides by its keys what is current, so this only skips rebuilding what a test
is not about (an export and a validation: seconds, each start, on a 2-core CPU)."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stgcnd_tools.daemon import DaemonProcess, stop
from tests.conftest import REPO

FRAMES = 30
DEFAULT_MODELS = (f'[[models]]\nname = "demo"\ndemo = true\nframes = {FRAMES}\n'
                  'backend = "onnxruntime"\nlabels = ["normal", "shoplifting"]\n')


def write_config(path: Path, endpoint: str, engines: Path, models: str | None = None,
                 **server: object) -> Path:
    lines = ["[server]", f'endpoint = "{endpoint}"', f'engines_dir = "{engines}"']
    for k, v in {"stats_interval": 1.0, "warmup_runs": 1, **server}.items():
        if isinstance(v, bool):  # TOML's spelling, not Python's
            lines.append(f"{k} = {str(v).lower()}")
            continue
        lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"')
    # The default model needs no torch (ONNX Runtime is in the base install), so that the
    # end-to-end tests run there too; a test about the torch backend names it in `models`.
    lines.append(models if models is not None else DEFAULT_MODELS)
    path.write_text("\n".join(lines) + "\n")
    return path


class NotifySocket:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[dict[str, str]] = []
        self._cursor = 0  # wait_for() resumes after the last message it returned

    def read(self, timeout: float) -> list[dict[str, str]]:
        """Messages received within `timeout` seconds (returns early on none pending)."""
        self.sock.settimeout(timeout)
        got = []
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.sock.settimeout(max(end - time.monotonic(), 0.001))
            try:
                data = self.sock.recv(4096)
            except socket.timeout:  # TimeoutError only from Python 3.10 (the tests run on 3.8)
                break
            msg = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            got.append(msg)
        self.messages.extend(got)
        return got

    def wait_for(self, key: str, timeout: float = 120.0,
                 alive: Callable[[], bool] | None = None) -> dict[str, str]:
        """The next message with `key` after the last one returned (nothing read is lost);
        given `alive`, stops waiting once the sender is gone."""
        end = time.monotonic() + timeout
        while True:
            gone = alive is not None and not alive()
            if gone:
                self.read(0.05)  # what it sent before it went
            for i in range(self._cursor, len(self.messages)):
                if key in self.messages[i]:
                    self._cursor = i + 1
                    return self.messages[i]
            if gone:
                raise AssertionError(f"no {key}: the sender is gone; got {self.messages}")
            if time.monotonic() >= end:
                raise AssertionError(f"no {key} within {timeout} s; got {self.messages}")
            self.read(0.2)

    def skip_seen(self) -> None:
        """Make wait_for() look only at messages not read yet."""
        self._cursor = len(self.messages)

    def close(self) -> None:
        self.sock.close()


# [[models]] text -> a copy of the engine store a daemon of those models built
_BUILT_STORES: dict[str, Path] = {}


def _models_text(config_path: Path) -> str | None:
    text = config_path.read_text()
    at = text.find("[[models]]")
    return text[at:] if at >= 0 else None


def _keep_store(engines: Path) -> Path:
    kept = Path(tempfile.mkdtemp(prefix="stgcnd-test-engines-"))
    atexit.register(shutil.rmtree, kept, True)
    shutil.copytree(engines, kept / "engines", ignore=shutil.ignore_patterns("*.lock"))
    return kept / "engines"


class Daemon:
    def __init__(self, tmp: Path, config_path: Path | None = None, env: dict | None = None,
                 endpoint: str | None = None, reuse_engines: bool = False,
                 **config: object) -> None:
        self.tmp = tmp
        self.reuse_engines = reuse_engines
        self.endpoint = endpoint or f"ipc://{tmp / 'd.sock'}"
        self.engines = tmp / "engines"
        self.config_path = config_path or write_config(tmp / "stgcnd.toml", self.endpoint,
                                                       self.engines, **config)
        self.notify = NotifySocket(tmp / f"notify-{time.monotonic_ns()}.sock")
        self.log_path = tmp / "daemon.log"
        self.env = {**os.environ, "NOTIFY_SOCKET": str(self.notify.path),
                    "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.start_args: list[str] = []  # global stgcnd flags, e.g. ["--log-level", "debug"]
        self.serve_args: list[str] = []  # serve's own flags, e.g. ["--engines", "DIR"]
        self.fd_limit: int | None = None  # RLIMIT_NOFILE (soft and hard) for the daemon

    def start(self, wait_ready: bool = True) -> Daemon:
        models = _models_text(self.config_path) if self.reuse_engines else None
        if models in _BUILT_STORES and not self.engines.exists():
            shutil.copytree(_BUILT_STORES[models], self.engines)
        self.proc = DaemonProcess(self.config_path, self.log_path, args=self.start_args,
                                  serve_args=self.serve_args,
                                  env=self.env, cwd=REPO,
                                  fd_limit=self.fd_limit).start().proc
        if wait_ready:
            try:
                self.notify.wait_for("READY", timeout=180, alive=self.running)
            except AssertionError:
                self.stop()
                log = self.log_path.read_text()
                raise AssertionError("daemon not ready; log:\n" + log) from None
            if models is not None and models not in _BUILT_STORES and self.engines.is_dir():
                _BUILT_STORES[models] = _keep_store(self.engines)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        return 0 if self.proc is None else stop(self.proc, timeout)

    def log_events(self) -> list[dict]:
        import json

        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def close(self) -> None:
        self.stop()
        self.notify.close()


def process_stats(pid: int) -> dict[str, int]:
    """A process's resident memory (kB), open file descriptors and threads, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_kb": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def stop_by_pid(daemon: Daemon, term_timeout: float = 15.0) -> int | None:
    """Teardown for tests that may leave the daemon wedged: SIGTERM, then SIGKILL after
    `term_timeout` s, by the pid this test started. Returns the exit code (None: never ran)."""
    if daemon.proc is None:
        return None
    code = stop(daemon.proc, term_timeout)
    daemon.close()
    return code
