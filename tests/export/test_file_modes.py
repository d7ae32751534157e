"""Files stgcnd writes get the permissions any new file gets (0666 less the umask), not
mkstemp's 0600: an exported model is read by the daemon's user or a colleague (issue #32,
item 9)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from stgcnd.fsutil import atomic_write_bytes, atomic_write_json


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


def test_stgcnd_export_writes_0644_under_umask_022(tmp_path, checkpoint_path, stgcnd_main):
    # In process: the umask is this process's, set around the command as a shell would set it
    # for a child; the narrow checkpoint writes the same two files as the demo's full widths.
    out = tmp_path / "single.onnx"
    old = os.umask(0o022)
    try:
        r = stgcnd_main("export", "--checkpoint", str(checkpoint_path), "--frames", "30",
                        "--skip-validation", "--output", str(out))
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    assert mode(out) == 0o644
    assert mode(out.with_name(out.name + ".json")) == 0o644
