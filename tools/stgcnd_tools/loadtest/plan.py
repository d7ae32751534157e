"""What a load test does, checked once: the options, and which camera runs in which process.

Times are seconds relative to the run's start (t = 0, the same instant in every process). The
run is `warmup` seconds (not measured), then `duration` measured seconds; joining cameras start
at `warmup + join_at`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from stgcnd.errors import UserError

MODES = ("window", "push")
DEFAULT_RATE_HZ = 25.0  # a camera's frame rate


@dataclass(frozen=True)
class LoadPlan:
    endpoint: str
    processes: int = 1
    cameras: int = 4               # per process, from the start
    mode: str = "window"
    rate_hz: float | None = DEFAULT_RATE_HZ  # per camera; None = closed loop
    duration: float = 10.0
    warmup: float = 2.0
    join: int = 0                  # extra cameras, over all processes
    join_at: float | None = None   # seconds into the measured interval; None = its middle
    join_window: float = 5.0       # how long after join_at the running cameras are watched
    model: str | None = None
    timeout_ms: float = 5000.0
    retries: int = 0               # the client's resends of a lost request (the demo's: 3)
    seed: int = 0
    run_id: str = ""               # prefixes camera ids so that every run's cameras are new
    server_key: str | None = None  # CURVE: the daemon's public key and the cameras' pair
    client_key: str | None = None  # (files or z85; stgcnd_client.curve)

    def __post_init__(self) -> None:
        if not self.run_id:
            object.__setattr__(self, "run_id", secrets.token_hex(3))
        check_plan(self)

    @property
    def closed_loop(self) -> bool:
        return self.rate_hz is None

    @property
    def end(self) -> float:
        """When cameras stop sending (the end of the measured interval)."""
        return self.warmup + self.duration

    @property
    def join_time(self) -> float:
        """When joining cameras start, relative to the run's start."""
        at = self.duration / 2 if self.join_at is None else self.join_at
        return self.warmup + at

    @property
    def total_cameras(self) -> int:
        return self.processes * self.cameras + self.join

    def cameras_of(self, process: int) -> list[CameraPlan]:
        """The cameras process `process` runs: its K from the start, then its share of joiners
        (dealt round robin so that joins load every process alike)."""
        out = []
        start_count = self.processes * self.cameras
        for k in range(self.cameras):
            index = process * self.cameras + k
            out.append(CameraPlan(f"lt-{self.run_id}-p{process}-c{k}", index,
                                  start=self._phase(index, start_count), joining=False))
        for j in range(process, self.join, self.processes):
            out.append(CameraPlan(f"lt-{self.run_id}-join{j}", start_count + j,
                                  start=self.join_time, joining=True))
        return out

    def _phase(self, index: int, count: int) -> float:
        # Open loop: spread the cameras' first sends over one period (real cameras are not
        # frame-synchronized); closed loop: everyone starts at once.
        if self.rate_hz is None or count == 0:
            return 0.0
        return (index / count) / self.rate_hz

    def to_dict(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "processes": self.processes,
                "cameras_per_process": self.cameras, "cameras": self.processes * self.cameras,
                "mode": self.mode, "closed_loop": self.closed_loop, "rate_hz": self.rate_hz,
                "duration_s": self.duration, "warmup_s": self.warmup, "join": self.join,
                "join_at_s": (self.join_time - self.warmup) if self.join else None,
                "join_window_s": self.join_window if self.join else None,
                "model": self.model, "timeout_ms": self.timeout_ms, "seed": self.seed,
                "run_id": self.run_id}


@dataclass(frozen=True)
class CameraPlan:
    camera_id: str
    index: int          # unique over the run: seeds its synthetic data
    start: float        # first send, seconds from the run's start
    joining: bool


def check_plan(plan: LoadPlan) -> None:
    if "://" not in plan.endpoint:
        raise UserError(f"--endpoint must look like ipc:///path or tcp://host:port, got "
                        f"{plan.endpoint!r}")
    if plan.processes < 1 or plan.cameras < 0 or plan.join < 0:
        raise UserError("--processes must be >= 1, --cameras and --join >= 0")
    if plan.processes * plan.cameras + plan.join < 1:
        raise UserError("no cameras: give --cameras >= 1 (per process) or --join >= 1")
    if plan.mode not in MODES:
        raise UserError(f"--mode must be one of {', '.join(MODES)}, got {plan.mode!r}")
    if plan.rate_hz is not None and not plan.rate_hz > 0:
        raise UserError(f"--rate must be > 0 Hz, got {plan.rate_hz} (or use --closed-loop)")
    if not plan.duration > 0 or plan.warmup < 0:
        raise UserError("--duration must be > 0 seconds and --warmup >= 0")
    if not plan.timeout_ms > 0:
        raise UserError(f"--timeout-ms must be > 0, got {plan.timeout_ms}")
    if plan.join:
        at = plan.join_time - plan.warmup
        if not 0 <= at < plan.duration:
            raise UserError(f"--join-at {at:g} must lie inside the measured interval "
                            f"[0, {plan.duration:g}) seconds (after --warmup)")
        if not plan.join_window > 0:
            raise UserError(f"--join-window must be > 0 seconds, got {plan.join_window}")
