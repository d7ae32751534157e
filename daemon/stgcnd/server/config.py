"""Daemon configuration: TOML file, then `STGCND_*` environment variables, then flags.

Plain values, checked once at load; unknown keys are errors (a typo must not silently fall back
to a default). No config at all serves the demo model on a local endpoint.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from stgcnd.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (JetPack 6)
    import tomli as tomllib

DEFAULT_CONFIG_PATH = Path("/etc/stgcnd/stgcnd.toml")
BACKENDS = ("auto", "tensorrt", "torch", "onnxruntime", "noop")
PRECISIONS = ("fp32", "fp16", "int8")
DEVICES = ("auto", "cpu", "cuda")


def default_runtime_dir() -> Path:
    """systemd's RuntimeDirectory when set, else a private per-user directory."""
    if os.environ.get("RUNTIME_DIRECTORY"):
        return Path(os.environ["RUNTIME_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/stgcnd-{os.getuid()}"
    return Path(base) / "stgcnd"


def default_engines_dir() -> Path:
    """systemd's StateDirectory, else ./engines in a development checkout, else the user cache."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0]) / "engines"
    if Path("engines").is_dir() and Path("pyproject.toml").is_file():
        return Path("engines")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "stgcnd" / "engines"


@dataclass(frozen=True)
class ModelConfig:
    name: str = "demo"
    checkpoint: Path | None = None
    layout: str = "mediapipe"
    persons: int = 1
    frames: int = 150
    motion: str = "first-difference"
    labels: tuple[str, ...] = ()
    backend: str = "auto"
    device: str = "auto"       # auto: the GPU when the backend can use one, else the CPU
    precision: str = "fp32"
    stride: int = 1            # push mode: one prediction every `stride` frames once full
    # Batching across cameras: the largest batch (0 = auto: 64 on a GPU, 16 on a CPU), the
    # batch shapes prepared before READY (a batch runs in the smallest bucket that holds it),
    # how long a batch may wait to fill (0: never wait while the device is idle) and how many
    # executors (each with its own runner, streams and graphs) share the model's queue.
    max_batch: int = 0
    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    max_queue_delay_us: int = 0
    instances: int = 1
    # One CUDA stream per camera for its window's upload and its result's download, ordered
    # against the batch by events; false moves a batch in one copy each way (docs/benchmarks.md
    # compares the two).
    client_streams: bool = True
    calibration: Path | None = None
    allow_synthetic_calibration: bool = False
    cuda_graph: bool = True    # on CUDA: one graph per bucket, captured before READY
    threads: int = 0           # CPU intra-op threads (0: the library's default, all cores)


@dataclass(frozen=True)
class ServerConfig:
    endpoint: str = ""                 # "" = ipc socket in the runtime directory
    engines_dir: Path | None = None    # None = default_engines_dir()
    stats_interval: float = 10.0       # seconds between latency / system log events
    socket_mode: int = 0o660
    queue_size: int = 8                # per camera; a full queue answers busy at once
    idle_timeout: float = 300.0        # camera state idle this long is reclaimed
    max_cameras: int = 64              # cameras served at once (each: a lane per executor)
    drain_timeout: float = 10.0        # SIGTERM: finish in-flight work within this
    stall_timeout: float = 30.0        # an executor busy this long in one batch stops the watchdog
    max_message_bytes: int = 4 * 1024 * 1024
    sndhwm: int = 1000
    rcvhwm: int = 1000
    warmup_runs: int = 3
    tegrastats: str | None = None      # path; None = look on PATH
    system_stats: bool = True
    log_level: str = "info"


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    models: tuple[ModelConfig, ...] = (ModelConfig(),)
    source: str = "built-in defaults (demo model)"

    @property
    def endpoint(self) -> str:
        return self.server.endpoint or f"ipc://{default_runtime_dir() / 'stgcnd.sock'}"

    @property
    def engines_dir(self) -> Path:
        return self.server.engines_dir or default_engines_dir()

    def model(self, name: str | None) -> ModelConfig | None:
        if name is None:
            return self.models[0]
        return next((m for m in self.models if m.name == name), None)


def _coerce(cls: type, where: str, raw: dict[str, Any]) -> Any:
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; known keys: "
                        f"{', '.join(known)}")
    values: dict[str, Any] = {}
    defaults = cls()
    for key, value in raw.items():
        default = getattr(defaults, key)
        ftype = str(known[key].type)
        try:
            if "Path" in ftype:
                value = None if value in (None, "") else Path(value)
            elif "tuple" in ftype:
                if isinstance(value, str):
                    value = [v.strip() for v in value.split(",") if v.strip()]
                if not isinstance(value, (list, tuple)):
                    raise TypeError("expected a list")
                if "int" in ftype:
                    if any(isinstance(v, bool) for v in value):
                        raise TypeError("expected integers")
                    value = tuple(int(v) for v in value)
                else:
                    value = tuple(str(v) for v in value)
            elif isinstance(default, bool):
                if isinstance(value, str):
                    if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                        raise ValueError(value)
                    value = value.lower() in ("1", "true", "yes")
                elif not isinstance(value, bool):
                    raise TypeError("expected true or false")
            elif isinstance(default, int):
                if isinstance(value, bool):
                    raise TypeError("expected an integer")
                value = int(value, 0) if isinstance(value, str) else int(value)
            elif isinstance(default, float):
                value = float(value)
            elif value is not None:
                value = str(value)
        except (TypeError, ValueError) as exc:
            raise UserError(f"{where}.{key}: invalid value {value!r} ({exc})") from None
        values[key] = value
    return cls(**values)


def _check(config: Config) -> Config:
    from stgcnd.model.graph import LAYOUTS

    names = [m.name for m in config.models]
    if not names:
        raise UserError(f"{config.source}: no [[models]] configured; add at least one")
    if len(set(names)) != len(names):
        raise UserError(f"{config.source}: model names must be unique, got {names}")
    for m in config.models:
        where = f"{config.source}: model {m.name!r}"
        if m.backend not in BACKENDS:
            raise UserError(f"{where}: backend must be one of {', '.join(BACKENDS)} "
                            "(noop: zero logits, for measuring the daemon itself)")
        if m.device not in DEVICES:
            raise UserError(f"{where}: device must be one of {', '.join(DEVICES)}")
        if m.precision not in PRECISIONS:
            raise UserError(f"{where}: precision must be one of {', '.join(PRECISIONS)}")
        if m.layout not in LAYOUTS:
            raise UserError(f"{where}: layout must be one of {', '.join(LAYOUTS)}")
        if m.persons < 1 or m.frames < 3 or m.stride < 1 or m.max_batch < 0 or m.threads < 0:
            raise UserError(f"{where}: persons and stride must be >= 1, frames >= 3, max_batch "
                            "(0 = auto) and threads >= 0")
        if not m.buckets or any(b < 1 for b in m.buckets) or m.instances < 1 \
                or not 0 <= m.max_queue_delay_us <= 1_000_000:
            raise UserError(f"{where}: buckets must be batch sizes >= 1 (e.g. [1, 2, 4, 8]), "
                            "instances >= 1, max_queue_delay_us in 0..1000000")
    s = config.server
    if s.stats_interval <= 0 or s.queue_size < 1 or s.drain_timeout <= 0 or s.max_cameras < 1:
        raise UserError(f"{config.source}: stats_interval and drain_timeout must be > 0, "
                        "queue_size and max_cameras >= 1")
    return config


def load_config(path: Path | None = None, env: dict[str, str] | None = None,
                overrides: dict[str, Any] | None = None) -> Config:
    """Read `path` (or the default path if it exists), apply env and flag overrides, check."""
    env = dict(os.environ if env is None else env)
    raw: dict[str, Any] = {}
    source = "built-in defaults (demo model)"
    if path is None and env.get("STGCND_CONFIG"):
        path = Path(env["STGCND_CONFIG"])
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UserError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: invalid TOML: {exc}") from None
        source = str(path)
    unknown = sorted(set(raw) - {"server", "models"})
    if unknown:
        raise UserError(f"{source}: unknown section(s) {', '.join(unknown)}; use [server] and "
                        "[[models]]")
    server_raw = dict(raw.get("server", {}))
    # STGCND_<KEY> overrides [server] keys, e.g. STGCND_ENDPOINT, STGCND_STATS_INTERVAL.
    server_keys = {f.name for f in fields(ServerConfig)}
    for key in server_keys:
        if f"STGCND_{key.upper()}" in env:
            server_raw[key] = env[f"STGCND_{key.upper()}"]
    for key, value in (overrides or {}).items():
        if value is not None:
            server_raw[key] = value
    server = _coerce(ServerConfig, f"{source} [server]", server_raw)
    models_raw = raw.get("models")
    if models_raw is None:
        models: tuple[ModelConfig, ...] = (ModelConfig(),)
    elif not isinstance(models_raw, list):
        raise UserError(f"{source}: models must be an array of tables: [[models]]")
    else:
        models = tuple(_coerce(ModelConfig, f"{source} [[models]] #{i + 1}", m)
                       for i, m in enumerate(models_raw))
    return _check(Config(server=server, models=models, source=source))


def with_server(config: Config, **changes: Any) -> Config:
    return replace(config, server=replace(config.server, **changes))
