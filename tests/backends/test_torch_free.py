"""The TensorRT serving path never imports torch (8 GB Jetsons share memory with cameras)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.backends.test_tensorrt_api import stub_env
from tests.conftest import REPO

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


def test_registry_and_backend_modules_import_without_torch():
    res = run("""
        import json
        import stgcnd.backends
        from stgcnd.backends import registry, tensorrt_backend, cuda
        from stgcnd.engines.options import BuildOptions
        avail = registry.available_backends()
        print(json.dumps({"avail": avail, "torch_loaded": sys.modules.get("torch") is not None}))
    """)
    assert set(res["avail"]) == {"tensorrt", "torch", "onnxruntime", "noop"}
    assert res["torch_loaded"] is False


def test_tensorrt_backend_goes_as_far_as_tensorrt_without_torch(tmp_path):
    """With real 10.3.0 bindings: import, API check, engine file read; then CUDA is needed."""
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"not an engine")
    env = stub_env("10.3.0")
    res = run(f"""
        import json
        from types import SimpleNamespace
        from pathlib import Path
        from stgcnd.backends.tensorrt_backend import TensorRTBackend
        from stgcnd.errors import BackendUnavailable
        art = SimpleNamespace(backend="tensorrt", precision="fp16", path=Path({str(engine)!r}),
                              onnx_path=None, manifest={{"input_shape": [3, 150, 33, 1],
                              "num_class": 2, "max_batch": 1}})
        try:
            TensorRTBackend.from_artifact(art)
            stage = "loaded"
        except BackendUnavailable as exc:
            stage = str(exc)
        except Exception as exc:       # stub runtime: "factory function returned nullptr"
            stage = type(exc).__name__ + ": " + str(exc)
        print(json.dumps({{"stage": stage, "tensorrt": "tensorrt" in sys.modules,
                           "torch_loaded": sys.modules.get("torch") is not None}}))
    """, env)
    assert res["tensorrt"] and res["torch_loaded"] is False
    # No pycuda here: stops at CUDA initialisation, past every TensorRT name check.
    pycuda = subprocess.run([sys.executable, "-c", "import pycuda"], capture_output=True)
    if pycuda.returncode != 0:
        assert "pycuda" in res["stage"], res["stage"]
    else:
        pytest.skip(f"pycuda present; stage reached: {res['stage']}")
