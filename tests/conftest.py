"""Shared fixtures: small original-format checkpoints written to disk like users have them
(narrow: the original's blocks with an eighth of its channels, for tests of plumbing);
running several `stgcnd` commands side by side; a `stgcnd` command in the test's own process."""

from __future__ import annotations

import os

# One thread for the math libraries of the test process and of everything it starts (daemons,
# child builds, peers), set before numpy or torch loads: the tests' tensors are small, and
# OpenMP's and OpenBLAS's worker threads spin while they wait, which on a shared 2-core CPU
# cost the fast tier about 3x the CPU (tests/model: 26.6 s -> 8.2 s) and as much wall time.
# A test about threads sets them itself (`threads = N`); set these to measure otherwise.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import subprocess
import sys

# Compiled modules kept (in the ignored __pycache__ folders), even where the environment says
# PYTHONDONTWRITEBYTECODE: without them this process compiles and assertion-rewrites every
# test module at each run (collection 6.6 s -> 3.0 s of CPU), and every daemon, build child
# and peer the tests start compiles the package again. TEST_NO_BYTECODE=1 keeps them off.
if not os.environ.get("TEST_NO_BYTECODE"):
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from stgcnd import log
from stgcnd.cli import main as stgcnd_cli
from stgcnd.model.architecture import WIDTHS
from stgcnd.model.demo import demo_state_dict

REPO = Path(__file__).resolve().parents[1]
# The original's 10 blocks, strides and residuals with an eighth of the channels: the same
# keys (344) and code paths, exported and validated in about half the CPU time, run far
# faster. Tests of numbers against the fp32 reference at full shape use `original_state`.
NARROW = tuple(w // 8 for w in WIDTHS)


def stgcnd_at_once(*argvs: list[str], cwd: Path | None = None
                   ) -> list[subprocess.CompletedProcess]:
    """Independent `stgcnd` commands run side by side (each mostly starts Python and
    imports); their results in the order given."""
    procs = [subprocess.Popen([sys.executable, "-m", "stgcnd", *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=cwd) for argv in argvs]
    done = []
    try:
        for argv, proc in zip(argvs, procs):
            out, err = proc.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


@pytest.fixture
def stgcnd_main(capsys, monkeypatch) -> Callable[..., subprocess.CompletedProcess]:
    """`stgcnd ARGV` run by the CLI's own `main` in this process: its exit status and what it
    wrote to stdout and stderr, as a CompletedProcess. For tests about what a command does and
    says; a test about the process itself (exit on a signal, what a fresh interpreter imports,
    a real pipe or terminal) starts `python -m stgcnd` instead. `env` is set for the call, and
    the logging the command configured is undone after it."""

    def run(*argv: str, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        with monkeypatch.context() as m:
            for key, value in (env or {}).items():
                m.setenv(key, value)
            if cwd is not None:
                m.chdir(cwd)
            capsys.readouterr()
            showwarning, logging_was = warnings.showwarning, log.logging_config()
            try:
                code = stgcnd_cli(list(argv))
            except SystemExit as exc:  # argparse: a usage error or --help
                code = exc.code if isinstance(exc.code, int) else 1
            finally:
                # The command logged to capsys's streams: back to structlog's defaults, which
                # look up sys.stdout at each call.
                structlog.reset_defaults()
                log._current.update(logging_was)
                warnings.showwarning = showwarning
            out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(argv), code, out, err)

    return run


def write_checkpoint(path: Path, state: dict, wrap: str | None = None, prefix: str = "") -> Path:
    torch = pytest.importorskip("torch")  # torch is an optional extra: checkpoints need it
    state = {f"{prefix}{k}": v for k, v in state.items()}
    torch.save({wrap: state, "epoch": 60} if wrap else state, path)
    return path


@pytest.fixture(scope="session")
def two_stream_state() -> dict:
    """A narrow two-stream checkpoint's tensors (NARROW)."""
    pytest.importorskip("torch")
    return demo_state_dict("mediapipe", "spatial", num_class=2, two_stream=True, seed=7,
                           widths=NARROW)


@pytest.fixture(scope="session")
def original_state() -> dict:
    """A two-stream checkpoint of the original's full widths."""
    pytest.importorskip("torch")
    return demo_state_dict("mediapipe", "spatial", num_class=2, two_stream=True, seed=7)


@pytest.fixture(scope="session")
def checkpoint_path(tmp_path_factory, two_stream_state) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "epoch60_model.pt", two_stream_state)
