"""The demo model's ONNX graph, built from numpy with the onnx package: the same function as
the independent numpy reference (no torch) and as the PyTorch network (when installed), with
the interface of the PyTorch export, on real-shaped windows (T=150, V=33, M=1 and M=5; the
slow tier) and on short ones (T=30: the same graph but for T, in the fast tier)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from stgcnd.engines.validate import ort_session
from stgcnd.export.demo_onnx import demo_onnx_bytes
from stgcnd.model.demo import spec_arrays
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from tests.model.numpy_reference import two_stream_forward

T, V = 150, 33


def _run(data: bytes, x: np.ndarray, dynamic: bool) -> np.ndarray:
    sess = ort_session(data)
    if dynamic:
        return sess.run(["output"], {"input": x})[0]
    return np.concatenate([sess.run(["output"], {"input": w[None]})[0] for w in x])


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


# Real-shaped windows take the numpy reference seconds (M=5: tens of seconds on a busy 2-core
# CPU), so T=150 is in the slow tier; T=30 checks the same function in the fast one.
FRAMES = [30, pytest.param(T, marks=pytest.mark.slow)]


@pytest.mark.parametrize("frames", FRAMES)
@pytest.mark.parametrize("persons,dynamic,formula", [
    (1, False, "first-difference"), (5, True, "first-difference"),
    (1, True, "second-difference")])
def test_demo_onnx_matches_numpy_reference(persons, dynamic, formula, frames):
    spec = ModelSpec(persons=persons, motion=formula, frames=frames)
    data = demo_onnx_bytes(spec, dynamic_batch=dynamic)
    onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
    # Realistic people (some person slots empty) and one window of uniform noise.
    x = np.concatenate([synthetic_windows(1, frames, persons, V, present=min(2, persons),
                                          seed=3),
                        np.random.default_rng(4).random((1, 3, frames, V, persons),
                                                        dtype=np.float32)])
    got = _run(data, x, dynamic)
    want = two_stream_forward(spec_arrays(spec), x, formula)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dynamic", [False, True])
def test_demo_onnx_has_the_torch_exports_interface(dynamic):
    proto = onnx.load_from_string(demo_onnx_bytes(ModelSpec(persons=5), dynamic))
    assert proto.opset_import[0].version == 17
    (inp,), (out,) = proto.graph.input, proto.graph.output
    assert (inp.name, out.name) == ("input", "output")
    batch = "batch" if dynamic else 1
    assert _dims(inp) == [batch, 3, T, V, 5] and _dims(out) == [batch, 2]
    ops = {n.op_type for n in proto.graph.node}
    assert {"Conv", "MatMul", "ReduceMean", "Gemm", "Pad"} <= ops
    assert "BatchNormalization" not in ops  # folded, like the PyTorch export's variant


@pytest.mark.parametrize("persons,frames", [
    (1, 30), (5, 30), *(pytest.param(m, T, marks=pytest.mark.slow) for m in (1, 5))])
def test_demo_onnx_matches_the_pytorch_network(persons, frames):
    pytest.importorskip("torch")
    from stgcnd.export.onnx_export import onnx_bytes
    from stgcnd.model.optimized import optimize_for_export
    from stgcnd.model.reference import load_for_inference as load_model
    from stgcnd.model.reference import reference_logits

    spec = ModelSpec(persons=persons, frames=frames)
    model = load_model(spec)
    x = synthetic_windows(2, frames, persons, V, present=min(2, persons), seed=12)
    data = demo_onnx_bytes(spec, dynamic_batch=True)
    got = _run(data, x, dynamic=True)
    np.testing.assert_allclose(got, reference_logits(model, x), atol=1e-4, rtol=1e-4)
    # The interface equals the PyTorch export's, input and output shapes included.
    torch_proto = onnx.load_from_string(onnx_bytes(model, optimize_for_export(model),
                                                   dynamic_batch=True))
    ours = onnx.load_from_string(data)
    for a, b in ((ours.graph.input[0], torch_proto.graph.input[0]),
                 (ours.graph.output[0], torch_proto.graph.output[0])):
        assert a.name == b.name
        assert [d.dim_value for d in a.type.tensor_type.shape.dim] == \
            [d.dim_value for d in b.type.tensor_type.shape.dim]
    assert ours.opset_import[0].version == torch_proto.opset_import[0].version


def test_demo_onnx_refuses_a_checkpoint_spec():
    with pytest.raises(ValueError, match="demo model only"):
        demo_onnx_bytes(ModelSpec(checkpoint="epoch60_model.pt"))
