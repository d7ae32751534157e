"""The TensorRT serving path never imports torch (8 GB Jetsons share memory with cameras):
the runtimes, provisioning and the CUDA layer import without it, and a TensorRT runtime gets
as far as CUDA with a release's real bindings and torch blocked."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap

from stgcnd.versions import TORCH_FIX
from tests.conftest import REPO
from tests.trt_stubs import stub_env

BLOCK_TORCH = """
import sys
sys.modules["torch"] = None          # any `import torch` now raises ImportError
"""


def run(code: str, env: dict[str, str] | None = None) -> dict:
    paths = [str(REPO / "daemon"), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = env or {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_runtime_modules_and_provisioning_import_without_torch():
    res = run("""
        import json
        import stgcnd.runtimes
        from stgcnd import provision
        from stgcnd.runtimes import available, import_torch, runtime_module
        from stgcnd.runtimes import cuda, cuda_batch, noop, onnxruntime_runtime
        from stgcnd.runtimes import tensorrt_runtime
        from stgcnd.engines.options import BuildOptions
        from stgcnd.errors import BackendUnavailable
        refused = {}
        for call in (import_torch, lambda: runtime_module("torch")):
            try:
                call()
            except BackendUnavailable as exc:
                refused[len(refused)] = str(exc)
        print(json.dumps({"avail": available(), "refused": list(refused.values()),
                          "torch_loaded": sys.modules.get("torch") is not None}))
    """)
    assert set(res["avail"]) == {"tensorrt", "torch", "onnxruntime", "noop"}
    assert res["avail"]["noop"] is None and res["avail"]["onnxruntime"] is None
    assert "not installed" in res["avail"]["torch"] and TORCH_FIX in res["avail"]["torch"]
    # Asking for torch says how to get it, rather than an ImportError traceback.
    assert len(res["refused"]) == 2 and all(TORCH_FIX in r for r in res["refused"])
    assert res["torch_loaded"] is False


def test_tensorrt_runtime_goes_as_far_as_cuda_without_torch(tmp_path):
    """With real 10.3.0 bindings: import, API check, engine file read; then the CUDA driver
    is needed (the only thing missing here)."""
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"not an engine")
    env = stub_env("10.3.0")
    res = run(f"""
        import json
        from pathlib import Path
        from stgcnd.runtimes import available
        from stgcnd.runtimes.tensorrt_runtime import TensorRTRuntime
        from stgcnd.errors import BackendUnavailable
        try:
            TensorRTRuntime(Path({str(engine)!r}), (3, 150, 33, 1), 2, 1, "fp16")
            stage = "loaded"
        except BackendUnavailable as exc:
            stage = str(exc)
        except Exception as exc:       # stub runtime: "factory function returned nullptr"
            stage = type(exc).__name__ + ": " + str(exc)
        print(json.dumps({{"stage": stage, "tensorrt": "tensorrt" in sys.modules,
                           "why_not": available()["tensorrt"],
                           "torch_loaded": sys.modules.get("torch") is not None}}))
    """, env)
    assert res["tensorrt"] and res["torch_loaded"] is False
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        # No driver here: it stops at the CUDA driver, past every TensorRT name check.
        assert "libcuda.so.1 not found" in res["stage"], res["stage"]
        assert res["why_not"] == "no CUDA GPU answers the driver"
    else:
        # A driver (a GPU machine): it stops at the stub's Runtime factory.
        assert "nullptr" in res["stage"] or "TypeError" in res["stage"], res["stage"]
