"""Shared fixtures: small original-format checkpoints written to disk like users have them;
running several `stgcnd` commands side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stgcnd.model.demo import demo_state_dict

REPO = Path(__file__).resolve().parents[1]


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


def write_checkpoint(path: Path, state: dict, wrap: str | None = None, prefix: str = "") -> Path:
    torch = pytest.importorskip("torch")  # torch is an optional extra: checkpoints need it
    state = {f"{prefix}{k}": v for k, v in state.items()}
    torch.save({wrap: state, "epoch": 60} if wrap else state, path)
    return path


@pytest.fixture(scope="session")
def two_stream_state() -> dict:
    pytest.importorskip("torch")
    return demo_state_dict("mediapipe", "spatial", num_class=2, two_stream=True, seed=7)


@pytest.fixture(scope="session")
def checkpoint_path(tmp_path_factory, two_stream_state) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "epoch60_model.pt", two_stream_state)
