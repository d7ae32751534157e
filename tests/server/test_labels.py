"""Labels against the model's own class count, on every runtime (issue #43, item 4).

A user gave 3 labels to the 2-class demo with backend "onnxruntime" and no torch: `config
check` passed, the daemon reached READY and named predictions wrongly. Now one check
(model.spec.check_labels) runs where the class count can be read: `config check` and `serve`
before loading (the demo model, an exported .onnx's graph output, a .pt with torch for
`config check`), and `serve` again on the loaded artefact itself before READY (the ONNX
Runtime session's output, a TensorRT engine's output binding, the torch checkpoint's
classifier), whatever the manifest or a sidecar says.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stgcnd.errors import UserError
from stgcnd.model.spec import ModelSpec
from stgcnd.runtimes import available
from stgcnd.server.config import load_config
from stgcnd.server.models import load_models
from tests.board_sim.board import no_torch_env
from tests.conftest import REPO
from tests.server.daemon_harness import FRAMES, write_config
from tests.trt_stubs import VERSIONS, stub_env

THREE = 'labels = ["normal", "shoplifting", "fighting"]\n'


def models_text(backend: str, extra: str = "", checkpoint: Path | None = None) -> str:
    source = f'checkpoint = "{checkpoint}"\n' if checkpoint else "demo = true\n"
    return (f'[[models]]\nname = "cam"\n{source}frames = {FRAMES}\nbackend = "{backend}"\n'
            f"{extra}")


def config_file(tmp_path: Path, models: str) -> Path:
    return write_config(tmp_path / "stgcnd.toml", "ipc:///tmp/stgcnd-labels-test.sock",
                        tmp_path / "engines", models=models)


def exported_demo(tmp_path: Path, sidecar_classes: int = 2) -> Path:
    """The 2-class demo graph as `stgcnd export` leaves it: the .onnx and its sidecar (which
    may claim another class count: the graph's own output is what counts)."""
    from stgcnd.export.demo_onnx import demo_onnx_bytes

    onnx = tmp_path / "model.onnx"
    data = demo_onnx_bytes(ModelSpec(frames=FRAMES), dynamic_batch=True)
    onnx.write_bytes(data)
    Path(f"{onnx}.json").write_text(json.dumps({
        "checkpoint_sha256": "ab" * 32, "onnx_sha256": hashlib.sha256(data).hexdigest(),
        "num_class": sidecar_classes, "layout": "mediapipe", "persons": 1, "frames": FRAMES,
        "motion": "first-difference", "dynamic_batch": True}))
    return onnx


# --- config check (and serve's checks before loading) ------------------------------------------

def test_config_check_refuses_three_labels_for_the_two_class_demo(tmp_path, stgcnd_main):
    r = stgcnd_main("config", "check", str(config_file(tmp_path,
                                                      models_text("onnxruntime", THREE))))
    assert r.returncode == 2, r.stdout
    assert "the demo model has 2 classes but 3 labels were given" in r.stderr
    assert "give exactly 2" in r.stderr


def test_config_check_reads_an_exported_onnx_s_output(tmp_path, stgcnd_main):
    onnx = exported_demo(tmp_path, sidecar_classes=3)
    r = stgcnd_main("config", "check", str(config_file(
        tmp_path, models_text("onnxruntime", THREE, checkpoint=onnx))))
    assert r.returncode == 2 and f"{onnx} has 2 classes but 3 labels" in r.stderr, r.stderr
    two = 'labels = ["normal", "shoplifting"]\n'
    r = stgcnd_main("config", "check", str(config_file(
        tmp_path, models_text("onnxruntime", two, checkpoint=onnx))))
    assert r.returncode == 0, r.stderr


def test_serve_refuses_them_before_loading_anything(tmp_path, stgcnd_main):
    r = stgcnd_main("serve", "--config", str(config_file(tmp_path,
                                                        models_text("onnxruntime", THREE))))
    assert r.returncode != 0
    assert "2 classes but 3 labels" in r.stdout + r.stderr
    assert not (tmp_path / "engines").exists() or not list((tmp_path / "engines").rglob("*.onnx"))


@pytest.mark.parametrize("backend", ["auto", "onnxruntime"])
def test_int8_without_calibration_is_refused_by_config_check_and_serve(tmp_path, stgcnd_main,
                                                                       backend):
    path = config_file(tmp_path, models_text(backend, 'precision = "int8"\n'))
    for argv in (("config", "check", str(path)), ("serve", "--config", str(path))):
        r = stgcnd_main(*argv)
        assert r.returncode != 0, argv
        said = r.stdout + r.stderr
        assert "needs calibration windows" in said and "allow_synthetic_calibration" in said, \
            said


# --- serve: the loaded artefact itself, before READY -----------------------------------------

def test_onnxruntime_reads_the_graph_s_classes_not_the_sidecar_s(tmp_path):
    """The .onnx's sidecar says 3 classes, so the manifest does; the graph has 2."""
    onnx = exported_demo(tmp_path, sidecar_classes=3)
    config = load_config(config_file(tmp_path, models_text("onnxruntime", THREE,
                                                           checkpoint=onnx)))
    with pytest.raises(UserError, match="has 2 classes but 3 labels were given"):
        load_models(config)


NO_TORCH_SERVE = r"""
import sys
from stgcnd.errors import UserError
from stgcnd.server.config import load_config
from stgcnd.server.models import load_models

try:
    loaded = load_models(load_config(sys.argv[1]))
except UserError as exc:
    print("REFUSED", exc)
else:
    print("SERVED", {name: m.labels for name, m in loaded.items()})
"""


@pytest.mark.slow
def test_onnxruntime_without_torch_refuses_them_before_ready(tmp_path):
    """The user's case: the demo on ONNX Runtime where torch is not installed, loaded as
    `serve` loads it (server.models.load_models, after the checks before loading)."""
    path = config_file(tmp_path, models_text("onnxruntime", THREE))
    r = subprocess.run([sys.executable, "-c", NO_TORCH_SERVE, str(path)], capture_output=True,
                       text=True, timeout=300, env=no_torch_env(), cwd=REPO)
    assert "REFUSED" in r.stdout, r.stdout + r.stderr[-3000:]
    assert "has 2 classes but 3 labels were given" in r.stdout
    assert "onnxruntime artefact" in r.stdout


@pytest.mark.skipif(available()["torch"] is not None, reason="needs torch installed")
def test_torch_refuses_them_with_the_same_check(tmp_path):
    config = load_config(config_file(tmp_path, models_text("torch", THREE)))
    with pytest.raises(UserError, match="has 2 classes but 3 labels were given"):
        load_models(config)


TRT_ENGINE = r"""
import json, pathlib, tempfile
import tensorrt as trt
from stgcnd.errors import UserError
from stgcnd.model.spec import check_labels
from stgcnd.runtimes import tensorrt_runtime as tb

class Engine:
    # What a deserialized engine answers (as the release's ICudaEngine): a dynamic batch, a
    # 2-class output binding.
    shapes = {"input": (-1, 3, 30, 33, 1), "output": (-1, 2)}
    num_io_tensors = 2
    num_optimization_profiles = 1
    def get_tensor_name(self, i): return ["input", "output"][i]
    def get_tensor_mode(self, name):
        return trt.TensorIOMode.INPUT if name == "input" else trt.TensorIOMode.OUTPUT
    def get_tensor_shape(self, name): return self.shapes[name]
    def get_tensor_dtype(self, name): return trt.DataType.FLOAT
    def get_tensor_profile_shape(self, name, profile):
        return [(1, 3, 30, 33, 1), (4, 3, 30, 33, 1), (8, 3, 30, 33, 1)]

class Runtime:
    def __init__(self, logger): pass
    def deserialize_cuda_engine(self, data): return Engine()

trt.Runtime = Runtime
tb.make_current = lambda: None
engine_file = pathlib.Path(tempfile.mkdtemp()) / "model.engine"
engine_file.write_bytes(b"x")
# The manifest says 3 classes (num_class=3); the engine's binding says 2.
runtime = tb.TensorRTRuntime(engine_file, (3, 30, 33, 1), 3, 8)
try:
    check_labels(("a", "b", "c"), runtime.artefact_classes, f"engine {engine_file.name}")
    refused = None
except UserError as exc:
    refused = str(exc)
print(json.dumps({"classes": runtime.artefact_classes, "refused": refused}))
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_tensorrt_reads_the_engine_s_output_binding(version):
    proc = subprocess.run([sys.executable, "-c", TRT_ENGINE], capture_output=True, text=True,
                          timeout=120, env=stub_env(version), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["classes"] == 2
    assert "engine model.engine has 2 classes but 3 labels were given" in got["refused"]
