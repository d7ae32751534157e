"""scripts/soak.py keeps working: a short real soak against its own daemon, and a soak that
must fail (no daemon at the endpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# the soak's daemon serves the torch backend: an optional extra (pip install -e ".[torch]").
pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SOAK = REPO / "scripts" / "soak.py"


def run_soak(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "daemon"), str(REPO / "clients"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(SOAK), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def test_short_soak_passes_and_reports(tmp_path):
    out = tmp_path / "soak.json"
    r = run_soak("--minutes", "0.25", "--cameras", "4", "--fps", "20", "--reload-every", "4",
                 "--malformed", "0.1", "--seed", "7", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    counts = report["counts"]
    assert counts["sent"] == counts["replies"] > 50
    assert not counts.get("lost") and not counts.get("duplicated")
    assert report["reloads"] >= 2 and report["daemon_exit_code"] == 0
    assert {"warm", "end"} <= set(report["samples"])
    gap = report["worst_gap_ms"]
    assert 0 < gap["median"] <= gap["max"] < 10_000
    assert "worst gap per camera" in r.stdout
    assert report["codes"]["ok"] > 0 and set(report["codes"]) - {"ok"}  # malformed mixed in
    assert "PASS" in r.stdout and "rss MB" in r.stdout


def test_soak_fails_when_the_daemon_does_not_answer(tmp_path):
    r = run_soak("--minutes", "0.1", "--cameras", "1", "--endpoint",
                 f"ipc://{tmp_path / 'nobody.sock'}", timeout=60)
    assert r.returncode != 0
    assert "no answer" in (r.stdout + r.stderr)


def test_soak_rejects_bad_arguments():
    r = run_soak("--minutes", "0", timeout=60)
    assert r.returncode == 2 and "--minutes" in r.stderr
