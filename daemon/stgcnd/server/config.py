"""Daemon configuration: TOML file, then `STGCND_*` environment variables, then flags.

Plain values, checked once at load; unknown keys are errors (a typo must not silently fall back
to a default), and so are unknown `STGCND_*` variables. Every error names where the bad value
came from: the TOML file and key, the environment variable, or the flag.

The demo model (random weights) is served only when asked for: `demo = true` in a [[models]]
entry, or no configuration file at all (the built-in default, what `stgcnd demo` relies on).
A [[models]] entry needs a `checkpoint` otherwise.
"""

from __future__ import annotations

import difflib
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
DISPATCH = ("auto", "loop", "thread")


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
    demo: bool = False         # serve the demo model (random weights) instead of a checkpoint
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
    # 24 and 48 besides the powers of two: a batch of 40 padded to 64 computes as 64, and
    # under open-loop load the longer cycle gathers bigger batches again; on the H100, 128
    # cameras x 25 Hz ran at p50 23.6 ms with powers of two and 8.6 ms with these
    # (docs/benchmarks.md). A TensorRT engine maps them onto the profiles it was built with.
    max_batch: int = 0
    buckets: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
    max_queue_delay_us: int = 0
    instances: int = 1
    # One CUDA stream per camera for its window's upload and its result's download, ordered
    # against the batch by events; false moves a batch in one copy each way (docs/benchmarks.md
    # compares the two).
    client_streams: bool = True
    # Who drives the model's runners: "loop" (the I/O loop launches each batch and checks for
    # its end on a timer: no thread hand-off on a request's path), "thread" (an executor
    # thread per instance runs whole batches) or "auto" (loop for runners that only enqueue
    # device work, i.e. CUDA graphs and noop; thread for CPU runtimes, whose compute would
    # hold up every camera).
    dispatch: str = "auto"
    noop_compute_us: int = 0   # backend noop only: each batch finishes this long after start
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
    max_connections: int = 0           # 0 = auto: 3/4 of the free fds, at most 4096
    max_rss_mb: int = 0                # over it, quiet peers are closed; 0 = READY's + 512
    drain_timeout: float = 10.0        # SIGTERM: finish in-flight work within this
    stall_timeout: float = 30.0        # an executor busy this long in one batch stops the watchdog
    max_message_bytes: int = 4 * 1024 * 1024
    sndhwm: int = 1000
    rcvhwm: int = 1000
    warmup_runs: int = 3
    tegrastats: str | None = None      # path; None = look on PATH
    system_stats: bool = True
    gc_freeze: bool = False            # see server/gcpause.py
    log_level: str = "info"


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    models: tuple[ModelConfig, ...] = (ModelConfig(demo=True),)
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


# STGCND_* variables stgcnd reads that are not [server] keys; any other STGCND_* is a typo.
NON_CONFIG_ENV = (
    "STGCND_CONFIG",            # the configuration file
    "STGCND_ENGINE_DIR",        # the engine store of the build/engines commands
    "STGCND_TEST_PAUSE_BUILD",  # tests: hold an engine build to test its lock
    "STGCND_TRT_STUB_CACHE",    # tests: where the TensorRT API stubs are unpacked
    "STGCND_TRT_STUB_DIR",
    "STGCND_FUZZ_CASES",        # tests: protocol fuzzing and soak knobs
    "STGCND_FUZZ_LONG",
    "STGCND_FUZZ_LONG_CASES",
    "STGCND_FUZZ_SEED",
    "STGCND_NET_TESTS",         # tests: enable tests that need the network
)


def _coerce(cls: type, where: str, raw: dict[str, Any],
            sources: dict[str, str] | None = None) -> Any:
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
            source = (sources or {}).get(key, f"{where}.{key}")
            raise UserError(f"{source}: invalid value {value!r} ({_expected(default, exc)})"
                            ) from None
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
        _check_demo(m, where)
        if m.backend not in BACKENDS:
            raise UserError(f"{where}: backend must be one of {', '.join(BACKENDS)} "
                            "(noop: zero logits, for measuring the daemon itself)")
        if m.device not in DEVICES:
            raise UserError(f"{where}: device must be one of {', '.join(DEVICES)}")
        if m.precision not in PRECISIONS:
            raise UserError(f"{where}: precision must be one of {', '.join(PRECISIONS)}")
        if m.dispatch not in DISPATCH:
            raise UserError(f"{where}: dispatch must be one of {', '.join(DISPATCH)}")
        if m.noop_compute_us and (m.backend != "noop" or not 0 <= m.noop_compute_us
                                  <= 1_000_000):
            raise UserError(f"{where}: noop_compute_us (0..1000000) is for backend = \"noop\" "
                            "only; remove it")
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


def _expected(default: Any, exc: Exception) -> str:
    if isinstance(default, bool):
        return "expected true or false"
    if isinstance(default, int):
        return "expected an integer"
    if isinstance(default, float):
        return "expected a number"
    return str(exc)


def _check_demo(m: ModelConfig, where: str) -> None:
    # A named model silently answering with random weights looks real ("shoplifting", 0.99):
    # the demo model must be asked for.
    if m.demo and m.checkpoint is not None:
        raise UserError(f"{where}: has both demo = true and a checkpoint; remove demo = true "
                        "to serve the checkpoint")
    if not m.demo and m.checkpoint is None:
        raise UserError(f"{where}: no checkpoint; add checkpoint = \"/path/to/model.pt\" to "
                        "serve your model, or demo = true to serve the demo model (random "
                        "weights: its predictions mean nothing)")


def _env_overrides(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """[server] key -> (variable, value) from STGCND_<KEY>; an unknown STGCND_* is an error."""
    by_name = {f"STGCND_{f.name.upper()}": f.name for f in fields(ServerConfig)}
    found = {}
    for name, value in env.items():
        if not name.startswith("STGCND_") or name in NON_CONFIG_ENV:
            continue
        if name not in by_name:
            close = difflib.get_close_matches(name, [*by_name, *NON_CONFIG_ENV], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UserError(f"environment variable {name} is not one stgcnd knows; {hint}"
                            f"[server] keys: {', '.join(sorted(by_name))}; others: "
                            f"{', '.join(NON_CONFIG_ENV[:2])}. Unset it or fix its name.")
        found[by_name[name]] = (name, value)
    return found


def _check_server(s: ServerConfig, where: dict[str, str]) -> None:
    """Ranges of [server] values, each error naming the value's source."""
    rules = (("stats_interval", s.stats_interval > 0, "must be > 0 seconds"),
             ("drain_timeout", s.drain_timeout > 0, "must be > 0 seconds"),
             ("queue_size", s.queue_size >= 1, "must be >= 1"),
             ("max_cameras", s.max_cameras >= 1, "must be >= 1"),
             ("max_connections", s.max_connections >= 0, "must be >= 0 (0 = auto)"),
             ("max_rss_mb", s.max_rss_mb >= 0, "must be >= 0 (0 = auto)"))
    for key, ok, rule in rules:
        if not ok:
            raise UserError(f"{where[key]}: {key} {rule}, got {getattr(s, key)!r}")


def load_config(path: Path | None = None, env: dict[str, str] | None = None,
                overrides: dict[str, Any] | None = None,
                flag_names: dict[str, str] | None = None) -> Config:
    """Read `path` (or the default path if it exists), apply env and flag overrides, check.

    `flag_names` maps an override's key to the flag it came from, for error messages
    (default: --key-with-dashes).
    """
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
    # Where each value came from, so that an error points at the right place to fix it.
    where = {f.name: f"{source} [server] {f.name}" for f in fields(ServerConfig)}
    # STGCND_<KEY> overrides [server] keys, e.g. STGCND_ENDPOINT, STGCND_STATS_INTERVAL.
    for key, (name, value) in _env_overrides(env).items():
        server_raw[key] = value
        where[key] = f"environment variable {name}"
    for key, value in (overrides or {}).items():
        if value is not None:
            server_raw[key] = value
            flag = (flag_names or {}).get(key, "--" + key.replace("_", "-"))
            where[key] = f"flag {flag}"
    server = _coerce(ServerConfig, f"{source} [server]", server_raw, where)
    _check_server(server, where)
    models_raw = raw.get("models")
    if models_raw is None and path is not None:
        raise UserError(f"{source}: no [[models]] entry; add one with name and "
                        "checkpoint = \"/path/to/model.pt\" (or demo = true to try the demo "
                        "model)")
    if models_raw is None:
        models: tuple[ModelConfig, ...] = (ModelConfig(demo=True),)
    elif not isinstance(models_raw, list):
        raise UserError(f"{source}: models must be an array of tables: [[models]]")
    else:
        models = tuple(_coerce(ModelConfig, f"{source} [[models]] #{i + 1}", m)
                       for i, m in enumerate(models_raw))
    return _check(Config(server=server, models=models, source=source))


def with_server(config: Config, **changes: Any) -> Config:
    return replace(config, server=replace(config.server, **changes))
