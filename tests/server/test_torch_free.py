"""A board without torch serves a checkpoint exported elsewhere (issue #22): given the .onnx
that `stgcnd export` wrote (with its sidecar), or a copy of a workstation's engine store
found by the checkpoint's sha256 whatever its path. The daemon and the build processes it
spawns run with `import torch` failing (tests/board_sim/sitecustomize.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from stgcnd_client import Client
from tests.board_sim.board import no_torch_env
from tests.conftest import REPO, write_checkpoint
from tests.server.daemon_harness import FRAMES, Daemon, write_config

pytestmark = pytest.mark.slow


def events(d: Daemon, name: str) -> list[dict]:
    return [e for e in d.log_events() if e.get("event") == name]


def model(checkpoint: object, backend: str = "auto", max_batch: str = "max_batch = 4\n"
          ) -> str:
    return (f'[[models]]\nname = "cam"\ncheckpoint = "{checkpoint}"\nframes = {FRAMES}\n'
            f'backend = "{backend}"\n{max_batch}labels = ["normal", "shoplifting"]\n')


@pytest.fixture
def windows():
    return np.random.default_rng(5).random((3, 3, FRAMES, 33, 1), dtype=np.float32)


@pytest.fixture
def reference(two_stream_state, tmp_path, windows):
    from stgcnd.model.loader import load_model, reference_logits
    from stgcnd.model.spec import ModelSpec

    ckpt = write_checkpoint(tmp_path / "workstation" / "epoch60_model.pt", two_stream_state) \
        if (tmp_path / "workstation").mkdir() is None else None
    spec = ModelSpec(checkpoint=ckpt, frames=FRAMES, labels=("normal", "shoplifting"))
    return ckpt, reference_logits(load_model(spec), windows)


def serve_and_compare(d: Daemon, windows: np.ndarray, expected: np.ndarray) -> None:
    with Client(d.endpoint) as c:
        got = np.stack([c.infer(w).logits for w in windows])
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_an_exported_onnx_is_served_without_torch(tmp_path, reference, windows):
    ckpt, expected = reference
    onnx = tmp_path / "board" / "model.onnx"
    onnx.parent.mkdir()
    # The README's command as it is written: the batch-dynamic export is the default.
    subprocess.run([sys.executable, "-m", "stgcnd", "export", "--checkpoint", str(ckpt),
                    "--frames", str(FRAMES), "--output", str(onnx)],
                   check=True, capture_output=True, cwd=REPO, timeout=300)
    d = Daemon(tmp_path, env=no_torch_env(), models=model(onnx))
    try:
        d.start()
        (ready,) = events(d, "ready")
        assert ready["models"]["cam"]["runtime"] == "onnxruntime"
        assert "the only CPU runtime here" in ready["models"]["cam"]["why"]
        assert events(d, "onnx_imported")
        serve_and_compare(d, windows, expected)
        assert d.stop() == 0
    finally:
        d.close()


def test_a_copied_engine_store_is_found_by_the_checkpoints_content(tmp_path, reference,
                                                                    windows):
    ckpt, expected = reference
    built = Daemon(tmp_path / "ws", models=model(ckpt, "onnxruntime")) \
        if (tmp_path / "ws").mkdir() is None else None
    try:
        built.start()
        assert built.stop() == 0
    finally:
        built.close()
    board = tmp_path / "board"
    board.mkdir()
    renamed = shutil.copy(ckpt, board / "shoplifting-v3.pt")  # another name, same content
    d = Daemon(board, env=no_torch_env(), models=model(renamed, "onnxruntime"))
    shutil.copytree(built.engines, d.engines)
    try:
        d.start()
        assert not events(d, "onnx_export_needed") and not events(d, "engine_build_started")
        assert events(d, "engine_reused")
        serve_and_compare(d, windows, expected)
        assert d.stop() == 0
    finally:
        d.close()


def test_a_store_built_by_build_config_serves_on_the_board_without_torch(tmp_path, reference,
                                                                         windows):
    """The second route of docs/jetson.md: `stgcnd build --config` with the board's
    configuration (max_batch automatic) where torch is, the store copied with the .pt."""
    ckpt, expected = reference
    ws = tmp_path / "ws"
    ws.mkdir()
    config = write_config(ws / "stgcnd.toml", f"ipc://{ws / 'unused.sock'}", ws / "engines",
                          model(ckpt, "onnxruntime", max_batch=""))
    r = subprocess.run([sys.executable, "-m", "stgcnd", "build", "--config", str(config)],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    board = tmp_path / "board"
    board.mkdir()
    renamed = shutil.copy(ckpt, board / "shoplifting-v3.pt")
    d = Daemon(board, env=no_torch_env(), models=model(renamed, "onnxruntime", max_batch=""))
    shutil.copytree(ws / "engines", d.engines)
    try:
        d.start()
        assert not events(d, "onnx_export_needed") and not events(d, "engine_build_started")
        assert events(d, "engine_reused")
        serve_and_compare(d, windows, expected)
        assert d.stop() == 0
    finally:
        d.close()


def test_without_torch_or_an_export_the_error_says_what_to_copy(tmp_path, reference):
    ckpt, _ = reference
    d = Daemon(tmp_path, env=no_torch_env(), models=model(ckpt, "onnxruntime"))
    try:
        d.start(wait_ready=False)
        assert d.proc.wait(timeout=120) != 0
        text = d.log_path.read_text()
        assert "stgcnd export --checkpoint epoch60_model.pt" in text and "Traceback" not in text
        # Only routes that work: the default export is batch-dynamic (no flag to forget), and
        # a copied store only when `build --config` prepared it.
        assert "--dynamic-batch" not in text and "stgcnd build --config" in text
    finally:
        d.close()
