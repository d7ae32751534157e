"""INT8 Q/DQ on ONNX Runtime CPU: really quantized, and agreeing with fp32 PyTorch.

The full measurement (T=150, hundreds of windows) is `python -m stgcnd_tools.measure_int8`;
its numbers are in docs/engines.md. Here: a few dozen windows, T=30 for the agreement
test and T=8 where the store is under test.
"""

from __future__ import annotations

import json

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
    with pytest.raises(UserError, match=rf"has shape \(4, 3, {FRAMES + 1}, 33, 1\)"):
        EngineStore(store_root).prepare(demo_spec(), "onnxruntime",
                                        BuildOptions(precision="int8", calibration=bad))


# The agreement bounds below hold for T=30 windows (at T=8, int8 top-1 agreement fell to 0.84):
# an accuracy test keeps the length it was measured at, and so takes more than a few seconds.
INT8_FRAMES = 30


@pytest.mark.slow
def test_int8_recipes_match_fp32(store_root, tmp_path):
    """The CPU recipe (the onnxruntime artefact on a CPU) and the TensorRT recipe (the shared
    Q/DQ model, run here by ONNX Runtime): each in its own layout, each close to fp32."""
    pytest.importorskip("torch")  # compares with the PyTorch network's activations
    from stgcnd.engines.quantize import quantize_qdq
    from stgcnd.engines.validate import validate_backend
    from stgcnd.model.reference import load_for_inference as load_model
    from stgcnd.model.spec import ModelSpec
    from stgcnd.provision.load import load_runtime
    from stgcnd.runtimes import runtime_module

    calib = tmp_path / "calib.npz"
    # Two arrays, as a recording split per camera would be; plus a non-window array (labels).
    np.savez(calib, cam0=synthetic_windows(16, INT8_FRAMES, seed=11),
             cam1=synthetic_windows(16, INT8_FRAMES, seed=12), labels=np.arange(32))
    model = load_model(ModelSpec(frames=INT8_FRAMES))
    store = EngineStore(store_root)
    options = BuildOptions(precision="int8", calibration=calib)
    art = store.prepare(model, "onnxruntime", options, validate=False)
    assert art.manifest["calibration"]["windows"] == 32

    # The CPU recipe: unsigned activations with their own zero points, int32 biases, every
    # convolution quantized (and the graph step's MatMuls where ONNX Runtime runs them).
    graph = onnx.load(str(art.path)).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("QuantizeLinear") >= ops.count("Conv") + ops.count("MatMul") > 0
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    activation_zero_points = [onnx.numpy_helper.to_array(inits[n.input[2]]) for n in graph.node
                              if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
    assert activation_zero_points and all(z.dtype == np.uint8 for z in activation_zero_points)
    assert any(z.any() for z in activation_zero_points)  # asymmetric
    biases = [producer[n.input[2]] for n in graph.node if n.op_type == "Conv" and len(n.input) > 2]
    assert biases and all(b.op_type == "DequantizeLinear"
                          and inits[b.input[0]].data_type == onnx.TensorProto.INT32
                          for b in biases)
    assert '"recipe": "cpu"' in json.dumps(art.manifest)  # recorded with the build

    # The TensorRT recipe, from the same fp32 ONNX.
    trt_qdq = tmp_path / "tensorrt-recipe.onnx"
    windows_calib = synthetic_windows(32, INT8_FRAMES, seed=11)
    quantize_qdq(art.onnx_path, trt_qdq, windows_calib, dynamic_batch=False)
    trt_graph = onnx.load(str(trt_qdq)).graph
    zero_points = [onnx.numpy_helper.to_array(t) for t in trt_graph.initializer
                   if t.name.endswith("zero_point")]
    # Symmetric INT8 (zero point 0), as TensorRT requires; no INT32 bias quantization.
    assert zero_points and all(z.dtype == np.int8 and not z.any() for z in zero_points)
    assert_parseable_by_tensorrt(trt_graph)

    windows = synthetic_windows(32, INT8_FRAMES, seed=99)
    ref = np.abs(model.module(__import__("torch").from_numpy(windows[:4])).detach().numpy())
    cpu = load_runtime(model, "onnxruntime", options, store)
    trt_recipe = runtime_module("onnxruntime").OnnxRuntimeRuntime(
        trt_qdq, tuple(model.spec.input_shape), model.num_class, 1, "int8", 0, "cpu")
    for runtime in (cpu, trt_recipe):
        try:
            result = validate_backend(model, runtime, windows)
        finally:
            runtime.close()
        assert result["windows"] == 32
        assert result["top1_agreement"] >= 0.95
        # Really INT8 (not float passed through) yet close: error well under the logit scale.
        assert 1e-4 < result["max_abs_diff"] < 0.2 * float(ref.max()), result


def assert_parseable_by_tensorrt(graph) -> None:
    """The Q/DQ layout onnx-tensorrt accepts, checked on the graph directly (not through
    stgcnd's own checker): DequantizeLinear reads only INT8, and every Conv/Gemm weight is a
    float initializer going through its own QuantizeLinear -> DequantizeLinear pair."""
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    int32_dq = []
    for n in graph.node:
        if n.op_type != "DequantizeLinear":
            continue
        src = n.input[0]
        assert src not in inits or inits[src].data_type == onnx.TensorProto.INT8
        q = producer.get(src)
        if q is not None and q.op_type == "QuantizeLinear":
            zp = inits[q.input[2]]
            if zp.data_type != onnx.TensorProto.INT8:
                int32_dq.append(n.name)
    assert not int32_dq, f"DequantizeLinear of non-INT8 tensors: {int32_dq[:5]}"
    weighted = [n for n in graph.node if n.op_type in ("Conv", "Gemm")]
    assert weighted
    for n in weighted:
        dq = producer[n.input[1]]
        q = producer[dq.input[0]]
        assert (dq.op_type, q.op_type) == ("DequantizeLinear", "QuantizeLinear"), n.name
        assert q.input[0] in inits and inits[q.input[0]].data_type == onnx.TensorProto.FLOAT
        if len(n.input) > 2:  # the bias stays a float initializer (TensorRT fuses it)
            assert inits[n.input[2]].data_type == onnx.TensorProto.FLOAT, n.name
    # One pair per quantized consumer (DedicatedQDQPair): no DequantizeLinear output feeds two
    # convolutions (a float residual Add beside one is fine: TensorRT fuses it).
    consumers: dict[str, int] = {}
    for n in weighted:
        for i in n.input[:2]:
            consumers[i] = consumers.get(i, 0) + 1
    shared = [n.name for n in graph.node
              if n.op_type == "DequantizeLinear" and consumers.get(n.output[0], 0) > 1]
    assert not shared, f"DequantizeLinear outputs shared by several convolutions: {shared[:5]}"


def test_checker_catches_onnxruntime_default_layout(tmp_path):
    """ONNX Runtime's default Q/DQ (INT32 bias DequantizeLinear) is what TensorRT rejects:
    the checker that guards every quantization must report it."""
    pytest.importorskip("torch")  # exports the PyTorch network
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from stgcnd.engines.quantize import _reader_class, tensorrt_qdq_problems
    from stgcnd.export.onnx_export import export_model
    from stgcnd.model.reference import load_for_inference as load_model
    from stgcnd.model.reference import export_module

    model = load_model(demo_spec())
    fp32, bad = tmp_path / "m.onnx", tmp_path / "ort-default.onnx"
    export_model(model, fp32, dynamic_batch=False, module=export_module(model))
    reader = _reader_class()(synthetic_windows(4, FRAMES, seed=5), "input", 1)
    quantize_static(str(fp32), str(bad), reader, quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=["Conv", "Gemm"], per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    problems = tensorrt_qdq_problems(bad)
    assert any("reads INT32" in p for p in problems), problems[:3]
    with pytest.raises(AssertionError):
        assert_parseable_by_tensorrt(onnx.load(str(bad)).graph)


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


def test_margin_change_follows_the_reference_top_two():
    from stgcnd.engines.validate import compare_logits

    ref = np.array([[3.0, 1.0, 0.0], [0.0, 2.0, 1.5]])
    got = np.array([[2.5, 1.0, 0.9], [0.0, 2.0, 2.5]])  # 2nd window: the top-1 flips
    c = compare_logits(ref, got)
    assert np.isclose(c["margin_change_max"], 1.0) and np.isclose(c["margin_change_median"], 0.75)
    assert c["top1_agreement"] == 0.5
