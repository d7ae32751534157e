"""Files stgcnd writes get the permissions any new file gets (0666 less the umask), not
mkstemp's 0600: an exported model is read by the daemon's user or a colleague (issue #32,
item 9)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from stgcnd.fsutil import atomic_write_bytes, atomic_write_json
from tests.conftest import REPO


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_atomic_writes_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        atomic_write_bytes(tmp_path / "model.onnx", b"onnx")
        atomic_write_json(tmp_path / "model.onnx.json", {"k": 1})
    finally:
        os.umask(old)
    for name in ("model.onnx", "model.onnx.json"):
        assert mode(tmp_path / name) == 0o666 & ~umask, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.json"]


def test_stgcnd_export_writes_0644_under_umask_022(tmp_path):
    pytest.importorskip("torch")  # export loads the model with PyTorch
    out = tmp_path / "single.onnx"
    r = subprocess.run([sys.executable, "-m", "stgcnd", "export", "--frames", "30",
                        "--skip-validation", "--output", str(out)], capture_output=True,
                       text=True, cwd=REPO, timeout=300, preexec_fn=lambda: os.umask(0o022))
    assert r.returncode == 0, r.stderr
    assert mode(out) == 0o644
    assert mode(out.with_name(out.name + ".json")) == 0o644
