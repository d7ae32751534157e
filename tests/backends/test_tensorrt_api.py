"""The TensorRT backend's version-dependent choices, against the real bindings of each release.

`../shared/tensorrt/stub-bindings.sh VERSION DIR` makes a release's real Python bindings
importable without TensorRT's libraries (nothing can run). Each version is checked in its own
subprocess; a version whose stub cannot be prepared here (no network, no compiler) is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

STUB = REPO.parent / "shared" / "tensorrt" / "stub-bindings.sh"
VERSIONS = ("8.6.1", "10.3.0", "11.4.0.106")


def stub_env(version: str) -> dict[str, str]:
    if not STUB.is_file():
        pytest.skip(f"{STUB} not found")
    out = Path(os.environ.get("STGCND_TRT_STUB_DIR", "/tmp")) / f"trt-{version}"
    proc = subprocess.run(["bash", str(STUB), version, str(out)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    if proc.returncode != 0:
        pytest.skip(f"cannot prepare TensorRT {version} bindings: {proc.stderr.strip()[-300:]}")
    env = dict(os.environ)
    lib, site = out / "lib", out / "site"
    env["LD_LIBRARY_PATH"] = f"{lib}:{env['LD_LIBRARY_PATH']}" if env.get(
        "LD_LIBRARY_PATH") else str(lib)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), str(REPO / "daemon"), str(REPO), env.get("PYTHONPATH")) if p)
    return env


def run_with(version: str, code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=stub_env(version), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CHECK = """
import json
import numpy as np
import tensorrt as trt
from stgcnd.backends import tensorrt_backend as tb
from stgcnd.errors import BackendUnavailable

mapped, refused = {}, []
for name in dir(trt.DataType):
    if not name.isupper():
        continue
    try:
        mapped[name] = tb.numpy_dtype(getattr(trt.DataType, name)).name
    except BackendUnavailable:
        refused.append(name)
# nptype is TensorRT's own mapping: ours must agree wherever both answer.
agree = {n: np.dtype(trt.nptype(getattr(trt.DataType, n))).name == d for n, d in mapped.items()}

class Engine:  # only the ICudaEngine calls engine_io makes, answering like a built engine
    num_io_tensors = 2
    def get_tensor_name(self, i): return ["input", "output"][i]
    def get_tensor_mode(self, n):
        return trt.TensorIOMode.INPUT if n == "input" else trt.TensorIOMode.OUTPUT
    def get_tensor_shape(self, n): return [-1, 3, 24, 33, 2] if n == "input" else [-1, 2]
    def get_tensor_dtype(self, n): return trt.DataType.FLOAT
    def get_tensor_profile_shape(self, n, p):
        return [[1, 3, 24, 33, 2], [4, 3, 24, 33, 2], [16, 3, 24, 33, 2]]

io = tb.engine_io(trt, Engine(), max_batch=8)
print(json.dumps({"version": tb.version_of(trt), "missing": tb.missing_api(trt),
                  "mapped": mapped, "refused": refused, "agree": agree,
                  "io": [[t.name, t.is_input, t.dtype.name, list(t.max_shape)] for t in io],
                  "ok_import": tb.import_tensorrt() is trt}))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_name_based_api_exists_in_each_release(version):
    res = run_with(version, CHECK)
    assert res["version"].startswith(version)
    assert res["missing"] == []
    assert res["ok_import"]
    assert res["mapped"]["FLOAT"] == "float32" and res["mapped"]["HALF"] == "float16"
    assert res["mapped"]["INT32"] == "int32" and res["mapped"]["BOOL"] == "bool"
    assert all(res["agree"].values()), res["agree"]
    # Types numpy cannot hold are refused with a clear error (BF16 from 10.x, FP4 in 11.x).
    assert "FP8" in res["refused"]
    if not version.startswith("8."):
        assert "BF16" in res["refused"] and res["mapped"]["INT64"] == "int64"
    assert res["io"] == [["input", True, "float32", [8, 3, 24, 33, 2]],
                         ["output", False, "float32", [8, 2]]]


def test_old_bindings_api_would_be_reported():
    # In 10.x the bindings-index API is gone: asking for it must be reported, not crash.
    res = run_with("10.3.0", """
        import json, tensorrt as trt
        from stgcnd.backends import tensorrt_backend as tb
        tb.REQUIRED_API["ICudaEngine"] += ("get_binding_index",)
        tb.REQUIRED_API["IExecutionContext"] += ("execute_async_v2",)
        print(json.dumps(tb.missing_api(trt)))
    """)
    assert res == ["ICudaEngine.get_binding_index", "IExecutionContext.execute_async_v2"]
