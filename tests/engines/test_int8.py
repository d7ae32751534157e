"""INT8 Q/DQ on ONNX Runtime CPU: really quantized, and agreeing with fp32 PyTorch.

The full measurement (T=150, hundreds of windows) is `python -m stgcnd.engines.measure_int8`;
its numbers are in docs/engines.md. Here: T=30 and a few dozen windows, to stay fast.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.errors import UserError
from stgcnd.model.synthetic import synthetic_windows
from tests.engines.conftest import FRAMES, demo_spec


def test_int8_refused_without_calibration(store_root):
    with pytest.raises(UserError, match="--allow-synthetic-calibration"):
        EngineStore(store_root).prepare(demo_spec(), "onnxruntime",
                                        BuildOptions(precision="int8"))


def test_calibration_file_of_wrong_shape_is_refused(store_root, tmp_path):
    bad = tmp_path / "calib.npz"
    np.savez(bad, windows=np.zeros((4, 3, FRAMES + 1, 33, 1), np.float32))
    with pytest.raises(UserError, match=r"has shape \(4, 3, 31, 33, 1\)"):
        EngineStore(store_root).prepare(demo_spec(), "onnxruntime",
                                        BuildOptions(precision="int8", calibration=bad))


def test_int8_qdq_matches_fp32(store_root, tmp_path):
    pytest.importorskip("torch")  # compares with the PyTorch network's activations
    from stgcnd.backends.onnxruntime_backend import OnnxRuntimeBackend
    from stgcnd.engines.validate import validate_backend
    from stgcnd.model import load_model

    calib = tmp_path / "calib.npz"
    # Two arrays, as a recording split per camera would be; plus a non-window array (labels).
    np.savez(calib, cam0=synthetic_windows(16, FRAMES, seed=11),
             cam1=synthetic_windows(16, FRAMES, seed=12), labels=np.arange(32))
    model = load_model(demo_spec())
    store = EngineStore(store_root)
    art = store.prepare(model, "onnxruntime", BuildOptions(precision="int8", calibration=calib),
                        validate=False)
    assert art.manifest["calibration"]["windows"] == 32

    graph = onnx.load(str(art.path)).graph
    ops = [n.op_type for n in graph.node]
    convs = ops.count("Conv")
    assert ops.count("QuantizeLinear") >= convs > 0   # every conv's input is quantized
    zero_points = [onnx.numpy_helper.to_array(t) for t in graph.initializer
                   if t.name.endswith("zero_point")]
    # Symmetric INT8 (zero point 0), as TensorRT requires; biases are int32.
    assert any(z.dtype == np.int8 for z in zero_points)
    assert all(z.dtype in (np.int8, np.int32) and not z.any() for z in zero_points)

    windows = synthetic_windows(32, FRAMES, seed=99)
    backend = OnnxRuntimeBackend.from_artifact(art)
    try:
        result = validate_backend(model, backend, windows)
    finally:
        backend.close()
    assert result["windows"] == 32
    assert result["top1_agreement"] >= 0.99
    ref = np.abs(model.module(__import__("torch").from_numpy(windows[:4])).detach().numpy())
    # Really INT8 (not float passed through) yet close: error well under the logit scale.
    assert 1e-4 < result["max_abs_diff"] < 0.1 * float(ref.max())


def test_same_calibration_data_moved_is_reused(store_root, tmp_path):
    calib = tmp_path / "a.npy"
    np.save(calib, synthetic_windows(8, FRAMES, seed=3))
    store = EngineStore(store_root)
    opts = BuildOptions(precision="int8", calibration=calib)
    first = store.prepare(demo_spec(), "onnxruntime", opts, validate=False)
    moved = calib.rename(tmp_path / "b.npy")
    again = store.prepare(demo_spec(), "onnxruntime",
                          BuildOptions(precision="int8", calibration=moved))
    assert not first.reused and again.reused
    np.save(moved, synthetic_windows(8, FRAMES, seed=4))
    changed = store.prepare(demo_spec(), "onnxruntime",
                            BuildOptions(precision="int8", calibration=moved), validate=False)
    assert not changed.reused and "calibration_sha256" in changed.reason
