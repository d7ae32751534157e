"""`--serve`: a daemon of the load test's own (stgcnd_tools.daemon) on a temporary ipc endpoint,
configured by a TOML file we write, or by the user's (`--serve-config`, endpoint overridden).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stgcnd.errors import UserError
from stgcnd_tools.daemon import DaemonProcess

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


class ServedDaemon(DaemonProcess):
    """Started and ready on entering (`with`), stopped on leaving."""

    def __init__(self, opts: ServeOptions, model: str = "loadtest", cameras: int = 0) -> None:
        tmp = Path(tempfile.mkdtemp(prefix="stgcnd-loadtest-"))
        config = opts.config or write_config(tmp / "loadtest.toml", opts, model, cameras)
        if not config.is_file():
            raise UserError(f"--serve-config {config} not found")
        super().__init__(config, opts.log_path or tmp / "daemon.log",
                         endpoint=f"ipc://{tmp / 'stgcnd.sock'}", engines=opts.engines)
        self.opts = opts

    def start(self) -> ServedDaemon:
        super().start()
        try:
            self.wait_ready(self.opts.ready_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def describe(self) -> dict[str, Any]:
        o = self.opts
        return {"pid": self.pid, "endpoint": self.endpoint, "config": str(self.config),
                "log": str(self.log_path), "backend": None if o.config else o.backend,
                "exit_code": self.returncode}
