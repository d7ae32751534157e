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
    # The checkpoint beside the file, named relative to it (check looks for it).
    path.write_text(example.stdout.replace("/var/lib/stgcnd/models/", ""))
    (tmp_path / "epoch60_model.pt").write_bytes(b"")
    check = stgcnd("config", "check", str(path))
    assert check.returncode == 0, check.stderr
    resolved = json.loads(check.stdout)
    assert resolved["models"][0]["name"] == "single"
    assert resolved["models"][0]["checkpoint"] == str(tmp_path / "epoch60_model.pt")
    assert resolved["endpoint"] == "ipc:///run/stgcnd/stgcnd.sock"


def test_check_and_serve_name_every_missing_file(tmp_path):
    path = tmp_path / "stgcnd.toml"
    path.write_text('[[models]]\nname = "a"\ncheckpoint = "models/a.pt"\n'
                    '[[models]]\nname = "b"\ndemo = true\ncalibration = "/nowhere/w.npz"\n')
    says = (f"model 'a': checkpoint not found: {tmp_path / 'models' / 'a.pt'}; model 'b': "
            "calibration not found: /nowhere/w.npz. Fix the path")
    check = stgcnd("config", "check", str(path))
    assert check.returncode == 2 and says in check.stderr and not check.stdout
    # The daemon refuses it the same way, before any model loads: one event, no traceback.
    serve = stgcnd("--log-format", "json", "serve", "--config", str(path), "--endpoint",
                   f"ipc://{tmp_path / 'd.sock'}")
    assert serve.returncode == 2
    [event] = [json.loads(line) for line in serve.stdout.splitlines()]
    assert event["event"] == "startup_failed" and says in event["error"]


def test_check_gives_the_daemons_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nqueue_sise = 3\n[[models]]\ndemo = true\n")
    check = stgcnd("config", "check", str(path))
    assert check.returncode == 2
    assert "unknown key(s) queue_sise; did you mean queue_size?" in check.stderr
