"""Shared fixtures: small original-format checkpoints written to disk like users have them."""

from __future__ import annotations

from pathlib import Path

import pytest

from stgcnd.model.demo import demo_state_dict

REPO = Path(__file__).resolve().parents[1]


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
