"""Run trtexec on an engine or ONNX model and keep everything it produces in one folder:
times.json, profile.json, layers.json, trtexec.log, run_config.json, engine_metadata.json.

trtexec is found on PATH, then at JetPack's /usr/src/tensorrt/bin and NGC's /opt/tensorrt/bin.
Not verified against a real trtexec in CI: the tests run a stand-in executable.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from stgcnd import __version__
from stgcnd.errors import UserError
from stgcnd.fsutil import file_sha256, read_system_file
from stgcnd.log import get_logger
from stgcnd_tools.profiling.detect import CANONICAL_NAMES
from stgcnd_tools.profiling.logparse import load_log

log = get_logger(__name__)

# What trtexec writes; the run's own two files are CANONICAL_NAMES' others.
ARTEFACT_NAMES = {k: CANONICAL_NAMES[k] for k in ("times", "profile", "layer_info", "log")}
PRECISION_FLAGS = ("fp16", "bf16", "int8", "fp8", "int4", "best", "stronglyTyped")
LOG_TAIL_LINES = 15


JETPACK_TRTEXEC = Path("/usr/src/tensorrt/bin/trtexec")
DEFAULT_LOCATIONS: tuple[Path, ...] = (JETPACK_TRTEXEC, Path("/opt/tensorrt/bin/trtexec"))


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_trtexec(explicit: str | Path | None = None, *, search_path: str | None = None,
                 locations: Sequence[Path] = DEFAULT_LOCATIONS, required: bool = False
                 ) -> Path | None:
    """The trtexec to run: `explicit` (which must exist), else on `search_path` ($PATH), else
    in `locations` (JetPack's, NGC's); None when there is none, or UserError if `required`."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not _is_executable(path):
            raise UserError(f"--trtexec {path}: not an executable file; point it at the trtexec "
                            f"binary, e.g. {JETPACK_TRTEXEC}")
        return path.resolve()
    on_path = shutil.which("trtexec", path=search_path)
    if on_path:
        return Path(on_path).resolve()
    found = next((c for c in locations if _is_executable(c)), None)
    if found is None and required:
        raise UserError(
            f"trtexec not found on PATH nor at {', '.join(str(p) for p in locations)}. It ships "
            f"with TensorRT: on Jetson it comes with JetPack (apt install nvidia-jetpack, or "
            f"tensorrt) as {JETPACK_TRTEXEC}; put it on PATH (export "
            f"PATH=$PATH:{JETPACK_TRTEXEC.parent}) or pass --trtexec PATH")
    return found


class TrtexecFailed(UserError):
    """trtexec exited non-zero; the message carries the exit code and the end of its log."""

    def __init__(self, message: str, returncode: int, log_path: Path, tail: list[str]):
        super().__init__(message)
        self.returncode = returncode
        self.log_path = log_path
        self.tail = tail


@dataclass
class RunOptions:
    """What to run; None leaves trtexec's default in place."""

    engine: Path | None = None
    onnx: Path | None = None
    shapes: str | None = None
    iterations: int | None = 200
    warmup_ms: int | None = 500
    avg_runs: int | None = 50
    duration_s: float | None = None
    cuda_graph: bool = True
    spin_wait: bool = False
    profile: bool = True
    separate_profile_run: bool = True
    layer_info: bool = True
    precisions: tuple[str, ...] = ()
    save_engine: Path | None = None
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    def model_path(self) -> Path:
        if (self.engine is None) == (self.onnx is None):
            raise UserError("give exactly one of --engine PATH or --onnx PATH")
        return Path(self.engine or self.onnx)  # type: ignore[arg-type]


@dataclass
class RunResult:
    out_dir: Path
    command: list[str]
    returncode: int
    duration_s: float
    log_path: Path
    artefacts: dict[str, Path]
    tensorrt_version: str | None = None
    missing: list[str] = field(default_factory=list)


def build_command(trtexec: Path, options: RunOptions, out_dir: Path) -> list[str]:
    """The trtexec argv for `options`, exporting artefacts into `out_dir`."""
    model = options.model_path()
    cmd = [str(trtexec)]
    cmd.append(f"--loadEngine={model}" if options.engine else f"--onnx={model}")
    if options.save_engine:
        if not options.onnx:
            raise UserError("--save-engine only makes sense with --onnx (trtexec builds the "
                            "engine from the ONNX model)")
        cmd.append(f"--saveEngine={options.save_engine}")
    for precision in options.precisions:
        if precision not in PRECISION_FLAGS:
            raise UserError(f"unknown precision flag {precision!r}; use one of "
                            f"{', '.join(PRECISION_FLAGS)}")
        cmd.append(f"--{precision}")
    if options.shapes:
        cmd.append(f"--shapes={options.shapes}")
    for flag, value in (("--iterations", options.iterations), ("--warmUp", options.warmup_ms),
                        ("--avgRuns", options.avg_runs), ("--duration", options.duration_s)):
        if value is not None:
            if value < 0:
                raise UserError(f"{flag} must be >= 0, got {value}")
            cmd.append(f"{flag}={value:g}" if isinstance(value, float) else f"{flag}={value}")
    if options.cuda_graph:
        cmd.append("--useCudaGraph")
    if options.spin_wait:
        cmd.append("--useSpinWait")
    cmd.append(f"--exportTimes={out_dir / ARTEFACT_NAMES['times']}")
    if options.profile:
        cmd.append(f"--exportProfile={out_dir / ARTEFACT_NAMES['profile']}")
        if options.separate_profile_run:
            # Keeps per-layer profiling overhead out of the timed iterations.
            cmd.append("--separateProfileRun")
    if options.layer_info:
        cmd.append(f"--exportLayerInfo={out_dir / ARTEFACT_NAMES['layer_info']}")
    cmd.append("--profilingVerbosity=detailed")
    cmd.extend(options.extra_args)
    return cmd


def file_metadata(path: Path) -> dict[str, Any]:
    """path, size, sha256 and mtime of a model file."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size_bytes": stat.st_size,
            "sha256": file_sha256(path),
            "mtime": datetime.fromtimestamp(stat.st_mtime, tz=timezone.utc).isoformat()}


def _l4t_release() -> str | None:
    text = read_system_file(Path("/etc/nv_tegra_release"))
    return text.splitlines()[0].strip() if text else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _stream_output(proc: subprocess.Popen[str], log_path: Path, echo: TextIO | None,
                   tail: deque[str]) -> None:
    assert proc.stdout is not None
    with log_path.open("w", encoding="utf-8") as log_file:
        for line in proc.stdout:
            log_file.write(line)
            log_file.flush()
            tail.append(line.rstrip("\n"))
            if echo is not None:
                echo.write(line)
                echo.flush()


def run_trtexec(options: RunOptions, out_dir: str | Path, *, trtexec: str | Path | None = None,
                echo: TextIO | None = None, timeout_s: float | None = None) -> RunResult:
    """Run trtexec, tee its output to out_dir/trtexec.log (and `echo`), record the run.

    Raises UserError when trtexec or the model is missing and TrtexecFailed (a UserError) when
    trtexec exits non-zero or runs past `timeout_s`.
    """
    model = options.model_path()
    if not model.is_file():
        raise UserError(f"{model}: no such file; pass the engine (--engine) or ONNX model "
                        "(--onnx) to profile")
    binary = find_trtexec(trtexec, required=True)
    assert binary is not None
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create output folder {out}: {exc}; pass a writable --out") \
            from None
    command = build_command(binary, options, out)
    log_path = out / ARTEFACT_NAMES["log"]
    engine_meta = {"stgcnd_engine_metadata": 1, "kind": "engine" if options.engine else "onnx",
                   **file_metadata(model)}
    _write_json(out / CANONICAL_NAMES["engine_metadata"], engine_meta)
    config: dict[str, Any] = {
        "stgcnd_run_config": 1,
        "command": command,
        "command_line": shlex.join(command),
        "trtexec": str(binary),
        "options": {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple)
                        else v) for k, v in asdict(options).items()},
        "out_dir": str(out.resolve()),
        "started_at": _now(),
        "finished_at": None,
        "exit_code": None,
        "versions": {"stgcnd": __version__, "python": platform.python_version(),
                     "platform": platform.platform(), "l4t": _l4t_release(), "tensorrt": None},
        "host": platform.node(),
    }
    _write_json(out / CANONICAL_NAMES["run_config"], config)
    log.info("trtexec_start", command=config["command_line"], out_dir=str(out))

    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", bufsize=1)
    except OSError as exc:
        raise UserError(f"cannot start {binary}: {exc}; check that it is a trtexec built for "
                        "this machine and that its TensorRT libraries are on LD_LIBRARY_PATH") \
            from None
    timed_out = threading.Event()

    def _kill() -> None:
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout_s, _kill) if timeout_s else None
    if timer:
        timer.start()
    try:
        _stream_output(proc, log_path, echo, tail)
        returncode = proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        proc.wait()
        raise
    finally:
        if timer:
            timer.cancel()
    duration = time.monotonic() - started

    tensorrt_version = load_log(log_path).tensorrt_version if log_path.exists() else None
    artefacts = {kind: out / name for kind, name in ARTEFACT_NAMES.items()
                 if (out / name).is_file()}
    expected = ["times", "log"] + (["profile"] if options.profile else []) + \
        (["layer_info"] if options.layer_info else [])
    missing = [ARTEFACT_NAMES[k] for k in expected if k not in artefacts]
    config.update(finished_at=_now(), exit_code=returncode, duration_s=round(duration, 3),
                  timed_out=timed_out.is_set(),
                  artefacts={k: p.name for k, p in artefacts.items()}, missing=missing)
    config["versions"]["tensorrt"] = tensorrt_version
    _write_json(out / CANONICAL_NAMES["run_config"], config)
    if options.save_engine and Path(options.save_engine).is_file():
        engine_meta["saved_engine"] = file_metadata(Path(options.save_engine))
        _write_json(out / CANONICAL_NAMES["engine_metadata"], engine_meta)

    if returncode != 0 or timed_out.is_set():
        log.error("trtexec_failed", exit_code=returncode, log=str(log_path))
        if timed_out.is_set():
            headline = f"trtexec ran past the {timeout_s:g} s limit and was stopped"
        elif returncode < 0:
            headline = f"trtexec was killed by signal {-returncode}"
        else:
            headline = f"trtexec failed with exit code {returncode}"
        shown = "\n".join(f"  | {line}" for line in tail) or "  | (no output)"
        raise TrtexecFailed(f"{headline}; full log: {log_path}; last lines:\n{shown}",
                            returncode, log_path, list(tail))
    if missing:
        log.warning("trtexec_artefacts_missing", missing=missing, out_dir=str(out))
    log.info("trtexec_done", duration_s=round(duration, 3), tensorrt_version=tensorrt_version,
             artefacts=sorted(artefacts))
    return RunResult(out_dir=out, command=command, returncode=returncode, duration_s=duration,
                     log_path=log_path, artefacts=artefacts, tensorrt_version=tensorrt_version,
                     missing=missing)
