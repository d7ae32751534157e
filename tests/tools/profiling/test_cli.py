"""`stgcnd trtexec run|parse|report` as a user runs them: `run` as a real subprocess (it starts
trtexec, a stand-in here, as a child), `parse` and `report` (what they read and say) called in
process (`stgcnd_main`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.tools.profiling.conftest import DATA, PYTHON, REPO, make_run_dir


def stgcnd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "stgcnd", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


def test_parse_profile_json(shared, stgcnd_main):
    name = "farabimahmud_detr_int8.exportProfile.json"
    proc = stgcnd_main("trtexec", "parse", str(shared / name), "--json", "--top", "0")
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)["files"][0]
    raw = [r for r in json.loads((shared / name).read_text()) if "name" in r]
    assert entry["kind"] == "profile"
    assert entry["profile"]["layers"] == len(raw) == 840
    assert entry["profile"]["count"] == 641
    assert len(entry["profile"]["per_layer"]) == 840


def test_parse_folder_text(shared, stgcnd_main):
    proc = stgcnd_main("trtexec", "parse", str(shared))
    assert proc.returncode == 0, proc.stderr
    for name in shared.iterdir():
        if name.suffix != ".md":
            assert f"{name.name}  [" in proc.stdout, name.name
    assert "Throughput" not in proc.stderr


def test_parse_count_types_and_derived_files(shared, tmp_path, stgcnd_main):
    layers = shared / "trex_mobilenetv2-qat_titanrtx.exportLayerInfo.json"
    proc = stgcnd_main("trtexec", "parse", str(layers), "--count-types", "Einsum,CaskConvolution")
    assert proc.returncode == 0, proc.stderr
    assert "Requested types: Einsum 0, CaskConvolution 34" in proc.stdout
    proc = stgcnd_main("trtexec", "parse", str(DATA / "handmade_trt10_times.json"), "--out",
                       str(tmp_path), "--batch", "4")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["batch"] == 4
    assert (tmp_path / "latency_percentiles.csv").is_file()


def test_parse_unknown_file_is_one_line_error(tmp_path, stgcnd_main):
    path = tmp_path / "x.json"
    path.write_text("{}")
    proc = stgcnd_main("trtexec", "parse", str(path))
    assert proc.returncode == 2
    assert "not a trtexec artefact" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_and_report(tmp_path, fake_trtexec_env):
    engine = tmp_path / "x.engine"
    engine.write_bytes(b"engine")
    out = tmp_path / "runs" / "x"
    proc = stgcnd("trtexec", "run", "--engine", str(engine), "--out", str(out), "--quiet",
                  "--iterations", "10", "--report", "--", "--noDataTransfers",
                  env=fake_trtexec_env)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(Path(fake_trtexec_env["FAKE_TRTEXEC_ARGV"]).read_text())
    assert argv[-1] == "--noDataTransfers"
    assert "--iterations=10" in argv
    assert f"run folder: {out}" in proc.stdout
    assert "GPU compute ms: median" in proc.stdout
    assert (out / "report.md").is_file()


def test_run_failure_exit_code_and_tail(tmp_path, fake_trtexec_env):
    engine = tmp_path / "x.engine"
    engine.write_bytes(b"engine")
    proc = stgcnd("trtexec", "run", "--engine", str(engine), "--out", str(tmp_path / "r"),
                  "--quiet", env={**fake_trtexec_env, "FAKE_TRTEXEC_EXIT": "4"})
    assert proc.returncode == 2
    assert "trtexec failed with exit code 4" in proc.stderr
    assert "&&&& FAILED TensorRT.trtexec" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_without_trtexec(tmp_path, fake_trtexec_env):
    if Path("/usr/src/tensorrt/bin/trtexec").exists() or Path("/opt/tensorrt/bin/trtexec").exists():
        pytest.skip("this machine has a real trtexec in a default location")
    engine = tmp_path / "x.engine"
    engine.write_bytes(b"engine")
    env = {**fake_trtexec_env, "PATH": str(tmp_path)}
    proc = stgcnd("trtexec", "run", "--engine", str(engine), "--out", str(tmp_path / "r"),
                  env=env)
    assert proc.returncode == 2
    assert "trtexec not found" in proc.stderr
    assert "/usr/src/tensorrt/bin/trtexec" in proc.stderr


def test_report_compare(shared, tmp_path, stgcnd_main):
    a = make_run_dir(tmp_path / "fp32", sorted(shared.glob("trex_tf-resnet50_rtx3090_fp32.*")))
    b = make_run_dir(tmp_path / "int8", [
        shared / "trex_mobilenetv2-qat_titanrtx.exportProfile.json",
        shared / "trex_mobilenetv2-qat_titanrtx.exportLayerInfo.json",
        shared / "nvidia_qat-ptq-notebook_mobilenetv2_qat-int8_trt8.2.5.trtexec.log"])
    out = tmp_path / "cmp"
    proc = stgcnd_main("trtexec", "report", str(a), "--compare", str(b), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"report: {out / 'report.md'}" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert [r["name"] for r in report["runs"]] == ["fp32", "int8"]
    assert report["runs"][1]["tensorrt_version"] == "8.2.5"
