"""`stgcnd config`: the example it prints loads, and `check` says what the daemon would."""

from __future__ import annotations

import json
import socket

import pytest

from stgcnd.runtimes import available


def test_example_then_check_round_trips(tmp_path, stgcnd_main):
    example = stgcnd_main("config", "example")
    assert example.returncode == 0, example.stderr
    path = tmp_path / "stgcnd.toml"
    # The checkpoint beside the file, named relative to it (check looks for it).
    path.write_text(example.stdout.replace("/var/lib/stgcnd/models/", ""))
    (tmp_path / "epoch60_model.pt").write_bytes(b"")
    check = stgcnd_main("config", "check", str(path))
    assert check.returncode == 0, check.stderr
    resolved = json.loads(check.stdout)
    assert resolved["models"][0]["name"] == "single"
    assert resolved["models"][0]["checkpoint"] == str(tmp_path / "epoch60_model.pt")
    assert resolved["endpoint"] == "ipc:///run/stgcnd/stgcnd.sock"


def test_check_and_serve_name_every_missing_file(tmp_path, stgcnd_main):
    path = tmp_path / "stgcnd.toml"
    path.write_text('[[models]]\nname = "a"\ncheckpoint = "models/a.pt"\n'
                    '[[models]]\nname = "b"\ndemo = true\ncalibration = "/nowhere/w.npz"\n')
    says = (f"model 'a': checkpoint not found: {tmp_path / 'models' / 'a.pt'}; model 'b': "
            "calibration not found: /nowhere/w.npz. Fix the path")
    check = stgcnd_main("config", "check", str(path))
    assert check.returncode == 2 and says in check.stderr and not check.stdout
    # The daemon refuses it the same way, before any model loads: one event, no traceback.
    serve = stgcnd_main("--log-format", "json", "serve", "--config", str(path), "--endpoint",
                   f"ipc://{tmp_path / 'd.sock'}")
    assert serve.returncode == 2
    [event] = [json.loads(line) for line in serve.stdout.splitlines()]
    assert event["event"] == "startup_failed" and says in event["error"]


def test_check_gives_the_daemons_error(tmp_path, stgcnd_main):
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nqueue_sise = 3\n[[models]]\ndemo = true\n")
    check = stgcnd_main("config", "check", str(path))
    assert check.returncode == 2
    assert "unknown key(s) queue_sise; did you mean queue_size?" in check.stderr


def _ipc(tmp_path) -> str:
    return f"ipc://{tmp_path / 'd.sock'}"


# What `serve` refused while `config check` passed it (issue #32), and the words that say so.
REFUSED = {
    "curve off on every interface": ('[server]\nendpoint = "tcp://0.0.0.0:{port}"\n'
                                     'curve = "off"\n[[models]]\ndemo = true\nbackend = "noop"\n',
                                     'curve = "off"'),
    "onnxruntime fp16": ('[server]\nendpoint = "{ipc}"\n[[models]]\ndemo = true\n'
                         'backend = "onnxruntime"\nprecision = "fp16"\n',
                         'backend = "onnxruntime" serves precision = "fp32" or "int8", not '
                         '"fp16"'),
    "int8 without calibration": ('[server]\nendpoint = "{ipc}"\n[[models]]\ndemo = true\n'
                                 'backend = "onnxruntime"\nprecision = "int8"\n',
                                 'precision = "int8" needs calibration windows: set '
                                 'calibration = '),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_check_refuses_what_serve_refuses_before_anything_loads(tmp_path, case,
                                                                stgcnd_main):
    text, says = REFUSED[case]
    path = tmp_path / "stgcnd.toml"
    path.write_text(text.format(ipc=_ipc(tmp_path), port=_free_port()))
    check = stgcnd_main("config", "check", str(path))
    assert check.returncode == 2 and says in check.stderr and not check.stdout, check.stderr
    # A configuration is fixed by editing it: the hint names keys, not command-line flags.
    assert "--" not in check.stderr
    serve = stgcnd_main("--log-format", "json", "serve", "--config", str(path))
    assert serve.returncode == 2
    # One event and nothing else: refused before any model was looked at.
    [event] = [json.loads(line) for line in serve.stdout.splitlines()]
    assert event["event"] == "startup_failed" and says in event["error"]


@pytest.mark.skipif(available()["tensorrt"] is None, reason="TensorRT can run here")
def test_check_refuses_tensorrt_where_it_cannot_run(tmp_path, stgcnd_main):
    path = tmp_path / "stgcnd.toml"
    path.write_text(f'[server]\nendpoint = "{_ipc(tmp_path)}"\n[[models]]\ndemo = true\n'
                    'backend = "tensorrt"\n')
    check = stgcnd_main("config", "check", str(path))
    assert check.returncode == 2, check.stderr
    assert 'backend = "tensorrt" cannot run on this machine' in check.stderr
    assert 'set backend = "auto"' in check.stderr


def test_check_says_what_it_could_not_check(tmp_path, stgcnd_main):
    path = tmp_path / "stgcnd.toml"
    path.write_text(f'[server]\nendpoint = "{_ipc(tmp_path)}"\n[[models]]\nname = "door"\n'
                    'checkpoint = "epoch60_model.pt"\nbackend = "auto"\n')
    (tmp_path / "epoch60_model.pt").write_bytes(b"")
    check = stgcnd_main("config", "check", str(path))
    assert check.returncode == 0, check.stderr
    json.loads(check.stdout)  # stdout stays the resolved configuration alone
    assert "Not checked without loading the models:" in check.stderr
    assert f"whether {_ipc(tmp_path)} is free to listen on" in check.stderr
    assert "model 'door': that the checkpoint loads" in check.stderr
    assert "model 'door': which runtime backend = \"auto\" serves" in check.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
