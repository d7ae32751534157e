"""`stgcnd build`, `stgcnd validate` and `stgcnd engines` as a user runs them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

from tests.engines.conftest import FRAMES, REPO


@pytest.fixture
def stgcnd(stgcnd_main) -> Callable[..., subprocess.CompletedProcess]:
    def run(*args: str) -> subprocess.CompletedProcess:
        return stgcnd_main("--log-format", "json", *args, cwd=REPO)

    return run


def test_build_reuses_and_validate_reports(store_root, tmp_path, stgcnd):
    model = ["--frames", str(FRAMES), "--engines", str(store_root), "--backend", "onnxruntime"]
    r = stgcnd("build", *model)
    assert r.returncode == 0, r.stderr
    assert "reused onnxruntime fp32" in r.stdout
    out = tmp_path / "v.json"
    r = stgcnd("validate", *model, "--count", "6", "--json", str(out))
    assert r.returncode == 0, r.stderr
    v = json.loads(out.read_text())
    assert v["windows"] == 6 and v["passed"] and v["top1_agreement"] == 1.0
    assert v["max_abs_diff"] < 1e-4 and set(v) >= {"mean_abs_diff", "thresholds", "artifact"}
    failed = stgcnd("validate", *model, "--count", "6", "--min-top1", "1.01")
    assert failed.returncode == 3 and "FAILED: top-1 agreement" in failed.stdout


def test_engines_list_and_prune(store_root, stgcnd):
    r = stgcnd("engines", "list", "--engines", str(store_root), "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["backend"], x["precision"], x["status"]) for x in rows] == [
        ("onnxruntime", "fp32", "current")]
    r = stgcnd("engines", "prune", "--engines", str(store_root))
    assert r.returncode == 0 and "0 file(s) removed" in r.stdout


def test_user_errors_are_one_line(store_root, stgcnd):
    r = stgcnd("build", "--frames", str(FRAMES), "--engines", str(store_root),
               "--backend", "onnxruntime", "--precision", "int8")
    assert r.returncode == 2
    err = [line for line in r.stderr.splitlines() if not line.startswith("{")]
    assert len(err) == 1 and "--allow-synthetic-calibration" in err[0]
    assert "Traceback" not in r.stderr


def test_validate_says_a_windows_file_is_missing_before_loading_anything(tmp_path, stgcnd):
    """Issue #32, item 9: the missing file is reported first, not after the model was loaded
    and the backends measured (8 s on a 2-core CPU): no engine store is even made."""
    engines = tmp_path / "engines"
    r = stgcnd("validate", "--frames", str(FRAMES), "--engines", str(engines),
               "--windows", str(tmp_path / "missing.npz"))
    assert r.returncode == 2, r.stderr
    err = [line for line in r.stderr.splitlines() if not line.startswith("{")]
    assert len(err) == 1 and f"--windows {tmp_path / 'missing.npz'}" in err[0], r.stderr
    assert "no such file" in err[0]
    assert not engines.exists()
