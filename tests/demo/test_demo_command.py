"""The newcomer's main job, `stgcnd demo`, run for real (shortened)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_stgcnd_demo_runs_cameras_and_stops_the_daemon(tmp_path):
    log = tmp_path / "daemon.log"
    r = subprocess.run([sys.executable, "-m", "stgcnd", "demo", "--cameras", "2", "--duration",
                        "8", "--stride", "25", "--engines", str(tmp_path / "engines"),
                        "--daemon-log", str(log)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "predictions mean nothing" in r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("cam")]
    assert [row[0] for row in rows[-2:]] == ["cam1", "cam2"]
    for row in rows[-2:]:
        replies, errors = int(row[1]), int(row[6])
        assert replies > 100 and errors == 0  # ~25 Hz for 8 s
    text = log.read_text()
    assert '"event": "ready"' in text and '"exit_code": 0' in text
