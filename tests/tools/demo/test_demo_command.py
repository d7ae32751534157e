"""The newcomer's main job, `stgcnd demo`, run for real (shortened), as the base install
(without torch) runs it: progress lines, the endpoint, a legend, no nan, the rate verdict."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.tools.demo.no_torch import no_torch_env

pytestmark = pytest.mark.slow


def test_stgcnd_demo_runs_cameras_and_stops_the_daemon(tmp_path):
    log = tmp_path / "daemon.log"
    r = subprocess.run([sys.executable, "-m", "stgcnd", "demo", "--cameras", "2", "--duration",
                        "8", "--stride", "25", "--engines", str(tmp_path / "engines"),
                        "--daemon-log", str(log)], env=no_torch_env(tmp_path),
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    err = r.stderr
    assert "predictions mean nothing" in err
    # One line per slow start-up step, with elapsed time, as the daemon logs them.
    steps = re.findall(r"^\[\s*[\d.]+ s\] (.*)$", err, re.M)
    for expected in ("exporting the model to ONNX", "ONNX exported and checked",
                     "validated onnxruntime fp32", "backend choice: skipping torch",
                     "warmed up and ready", "daemon ready on ipc://"):
        assert any(expected in s for s in steps), (expected, steps)
    assert re.search(r"start-up took [\d.]+ s\. Clients connect to ipc://\S+stgcnd\.sock", err)
    assert re.search(r"took startup [\d.]+ s, cameras (8|9)\.\d s, shutdown", err)
    assert "nan" not in r.stdout
    assert "columns: replies" in r.stdout and "compute ms =" in r.stdout
    assert "kept their rate" in err or "below their 25 fps" in err
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("cam")]
    assert [row[0] for row in rows[-2:]] == ["cam1", "cam2"]
    for row in rows[-2:]:
        replies, compute, errors = int(row[1]), float(row[6]), int(row[7])
        assert replies > 100 and compute > 0 and errors == 0  # ~25 Hz for 8 s
    text = log.read_text()
    assert '"event": "ready"' in text and '"exit_code": 0' in text
    # Events: each camera's starts on the demo model's constant class, ends at the shutdown.
    assert "events: 2 started, 2 ended" in err
    assert re.search(r"^event cam1/demo/1/\d+: abnormal started on cam1 at ", err, re.M)
    assert re.search(r"^event cam2/demo/1/\d+: ended at .* \(shutdown\)$", err, re.M)
