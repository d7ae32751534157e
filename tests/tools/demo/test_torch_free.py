"""The base install (no torch) serves the demo model: export, build, validation, auto, serve."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from stgcnd.model.synthetic import synthetic_windows
from stgcnd_client import Client
from tests.server.daemon_harness import Daemon
from tests.tools.demo.no_torch import no_torch_env

pytestmark = pytest.mark.slow


def test_blocker_makes_torch_unimportable(tmp_path):
    r = subprocess.run([sys.executable, "-c", "import torch"], env=no_torch_env(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr


def test_demo_daemon_serves_without_torch(tmp_path):
    frames = 30  # short windows; the path, not T, is under test
    daemon = Daemon(tmp_path, env=no_torch_env(tmp_path),
                    models=f'[[models]]\nname = "demo"\ndemo = true\nframes = {frames}\n')
    try:
        daemon.start()
        x = synthetic_windows(1, frames, 1, seed=3)[0]
        with Client(daemon.endpoint, camera_id="cam1", timeout=60) as client:
            info = client.hello()
            assert info.models[0].name == "demo"
            res = client.infer(x)
        assert res.label_name in ("normal", "abnormal")
        assert np.isclose(sum(res.probs), 1.0, atol=1e-4)
    finally:
        assert daemon.stop() == 0
        daemon.close()
    events = daemon.log_events()
    by_name = {e["event"]: e for e in events}
    assert "import of torch halted" not in daemon.log_path.read_text()
    assert by_name["auto_backend_skipped"]["backend"] == "torch"
    reason = by_name["auto_backend_skipped"]["reason"]
    assert "not installed" in reason and "stgcnd[torch]" in reason and "JetPack" in reason
    assert by_name["model_ready"]["backend"] == "onnxruntime"
    assert by_name["onnx_exported"]["variant"] == "numpy-demo"
    validated = by_name["engine_validated"]
    assert validated["finite"] and validated["max_abs_diff"] < 1e-4


def test_a_checkpoint_without_torch_says_what_to_install(tmp_path):
    ckpt = tmp_path / "epoch60_model.pt"
    ckpt.write_bytes(b"not read: torch is checked first")
    r = subprocess.run([sys.executable, "-m", "stgcnd", "build", "--checkpoint", str(ckpt),
                        "--backend", "onnxruntime", "--engines", str(tmp_path / "engines")],
                       env=no_torch_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert 'pip install -e ".[torch]"' in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("argv", [
    ["export", "--optimized", "-o", "OUT/x.onnx"],   # the demo's plain export needs no torch
    ["bench", "--backends", "onnxruntime"],           # the baseline is PyTorch eager
])
def test_commands_that_need_torch_say_what_to_install(tmp_path, argv):
    argv = [a.replace("OUT", str(tmp_path)) for a in argv]
    r = subprocess.run([sys.executable, "-m", "stgcnd", *argv], env=no_torch_env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "needs PyTorch" in r.stderr and 'pip install -e ".[torch]"' in r.stderr
    assert "Traceback" not in r.stderr
