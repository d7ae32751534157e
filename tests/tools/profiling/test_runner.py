"""The runner: command line, a real subprocess (stand-in trtexec), recorded run, errors."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from stgcnd.errors import UserError
from stgcnd_tools.profiling.runner import (
    RunOptions,
    TrtexecFailed,
    build_command,
    find_trtexec,
    run_trtexec,
)
from tests.tools.profiling.conftest import DATA, FAKE_TRTEXEC


@pytest.fixture
def engine(tmp_path: Path) -> Path:
    path = tmp_path / "model.engine"
    path.write_bytes(os.urandom(4096))
    return path


@pytest.fixture
def fake_env(monkeypatch, tmp_path):
    argv_file = tmp_path / "argv.json"
    monkeypatch.setenv("FAKE_TRTEXEC_ARGV", str(argv_file))
    return argv_file


def test_command_line_for_engine(tmp_path, engine):
    out = tmp_path / "run"
    options = RunOptions(engine=engine, shapes="input:1x3x150x33x1", iterations=300,
                         warmup_ms=250, avg_runs=20, spin_wait=True,
                         extra_args=("--noDataTransfers",))
    cmd = build_command(Path("/x/trtexec"), options, out)
    assert cmd == [
        "/x/trtexec", f"--loadEngine={engine}", "--shapes=input:1x3x150x33x1",
        "--iterations=300", "--warmUp=250", "--avgRuns=20", "--useCudaGraph", "--useSpinWait",
        f"--exportTimes={out / 'times.json'}", f"--exportProfile={out / 'profile.json'}",
        "--separateProfileRun", f"--exportLayerInfo={out / 'layers.json'}",
        "--profilingVerbosity=detailed", "--noDataTransfers"]


def test_command_line_switches(tmp_path):
    onnx = tmp_path / "m.onnx"
    cmd = build_command(Path("trtexec"), RunOptions(
        onnx=onnx, cuda_graph=False, profile=False, precisions=("fp16", "int8"),
        save_engine=tmp_path / "m.engine", duration_s=2.5, iterations=None), tmp_path)
    assert f"--onnx={onnx}" in cmd
    assert f"--saveEngine={tmp_path / 'm.engine'}" in cmd
    assert "--fp16" in cmd and "--int8" in cmd and "--duration=2.5" in cmd
    assert not any(a.startswith(("--iterations", "--exportProfile", "--separateProfileRun",
                                 "--useCudaGraph")) for a in cmd)
    cmd = build_command(Path("trtexec"), RunOptions(onnx=onnx, separate_profile_run=False),
                        tmp_path)
    assert "--separateProfileRun" not in cmd and any(a.startswith("--exportProfile")
                                                    for a in cmd)


@pytest.mark.parametrize(("options", "message"), [
    (RunOptions(), "exactly one of --engine"),
    (RunOptions(engine=Path("a"), onnx=Path("b")), "exactly one of --engine"),
    (RunOptions(engine=Path("a"), save_engine=Path("b")), "only makes sense with --onnx"),
    (RunOptions(engine=Path("a"), precisions=("fp64",)), "unknown precision"),
    (RunOptions(engine=Path("a"), iterations=-1), "--iterations must be >= 0"),
])
def test_bad_options(tmp_path, options, message):
    with pytest.raises(UserError, match=message):
        build_command(Path("trtexec"), options, tmp_path)


def test_run_with_stand_in(tmp_path, engine, fake_env):
    out = tmp_path / "run"
    result = run_trtexec(RunOptions(engine=engine, iterations=50), out, trtexec=FAKE_TRTEXEC)
    assert result.returncode == 0
    assert json.loads(fake_env.read_text()) == result.command[1:]
    assert sorted(result.artefacts) == ["layer_info", "log", "profile", "times"]
    assert (out / "times.json").read_bytes() == (DATA / "handmade_trt10_times.json").read_bytes()
    assert (out / "trtexec.log").read_text() == \
        (DATA / "handmade_trt10.3_trtexec.log").read_text()
    assert result.tensorrt_version == "10.3.0"
    config = json.loads((out / "run_config.json").read_text())
    assert config["command"] == result.command
    assert config["exit_code"] == 0
    assert config["options"]["iterations"] == 50
    assert config["versions"]["tensorrt"] == "10.3.0"
    assert config["trtexec"] == str(FAKE_TRTEXEC)
    meta = json.loads((out / "engine_metadata.json").read_text())
    assert meta["sha256"] == hashlib.sha256(engine.read_bytes()).hexdigest()
    assert meta["size_bytes"] == 4096
    assert meta["path"] == str(engine.resolve())
    assert meta["kind"] == "engine"


def test_log_is_echoed(tmp_path, engine, fake_env):
    import io

    echo = io.StringIO()
    run_trtexec(RunOptions(engine=engine), tmp_path / "run", trtexec=FAKE_TRTEXEC, echo=echo)
    assert echo.getvalue() == (DATA / "handmade_trt10.3_trtexec.log").read_text()


def test_failure_reports_exit_code_and_log_tail(tmp_path, engine, fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_TRTEXEC_EXIT", "3")
    with pytest.raises(TrtexecFailed) as info:
        run_trtexec(RunOptions(engine=engine), tmp_path / "run", trtexec=FAKE_TRTEXEC)
    err = info.value
    assert err.returncode == 3
    assert "exit code 3" in str(err)
    assert "Engine could not be created from network" in str(err)
    assert "&&&& FAILED" in err.tail[-1]
    assert str(tmp_path / "run" / "trtexec.log") in str(err)
    config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert config["exit_code"] == 3


def test_timeout_stops_trtexec(tmp_path, engine, fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_TRTEXEC_SLEEP", "30")
    with pytest.raises(TrtexecFailed, match=r"ran past the 0\.5 s limit"):
        run_trtexec(RunOptions(engine=engine), tmp_path / "run", trtexec=FAKE_TRTEXEC,
                    timeout_s=0.5)


def test_missing_artefacts_are_reported_not_fatal(tmp_path, engine, fake_env, monkeypatch):
    monkeypatch.setenv("FAKE_TRTEXEC_SKIP", "profile,layers")
    result = run_trtexec(RunOptions(engine=engine), tmp_path / "run", trtexec=FAKE_TRTEXEC)
    assert result.missing == ["profile.json", "layers.json"]


def test_missing_model_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        run_trtexec(RunOptions(engine=tmp_path / "nope.engine"), tmp_path / "run",
                    trtexec=FAKE_TRTEXEC)


def test_find_trtexec(tmp_path):
    assert find_trtexec(search_path=str(FAKE_TRTEXEC.parent), locations=()) == FAKE_TRTEXEC
    assert find_trtexec(search_path=str(tmp_path), locations=()) is None
    assert find_trtexec(search_path=str(tmp_path), locations=(FAKE_TRTEXEC,)) == FAKE_TRTEXEC
    assert find_trtexec(FAKE_TRTEXEC) == FAKE_TRTEXEC
    with pytest.raises(UserError, match="not an executable file"):
        find_trtexec(tmp_path / "trtexec")


def test_absent_trtexec_says_how_to_get_it(tmp_path):
    with pytest.raises(UserError) as info:
        find_trtexec(search_path=str(tmp_path), locations=(tmp_path / "nope",), required=True)
    message = str(info.value)
    assert "/usr/src/tensorrt/bin/trtexec" in message
    assert "JetPack" in message and "PATH" in message and "--trtexec" in message
