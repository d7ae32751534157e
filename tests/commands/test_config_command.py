"""`stgcnd config`: the example it prints loads, and `check` says what the daemon would."""

from __future__ import annotations

import json
import subprocess
import sys


def stgcnd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stgcnd", *args], capture_output=True,
                          text=True, timeout=60)


def test_example_then_check_round_trips(tmp_path):
    example = stgcnd("config", "example")
    assert example.returncode == 0, example.stderr
    path = tmp_path / "stgcnd.toml"
    path.write_text(example.stdout)
    check = stgcnd("config", "check", str(path))
    assert check.returncode == 0, check.stderr
    resolved = json.loads(check.stdout)
    assert resolved["models"][0]["name"] == "single"
    assert resolved["endpoint"] == "ipc:///run/stgcnd/stgcnd.sock"


def test_check_gives_the_daemons_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nqueue_sise = 3\n[[models]]\ndemo = true\n")
    check = stgcnd("config", "check", str(path))
    assert check.returncode == 2
    assert "unknown key(s) queue_sise; did you mean queue_size?" in check.stderr
