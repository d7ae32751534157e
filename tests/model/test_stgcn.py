"""The torch ST-GCN against an independent numpy forward pass on original-format weights."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # an optional extra: pip install -e ".[torch]"

from stgcnd.model.demo import demo_state_dict
from stgcnd.model.reference import load_for_inference as load_model
from stgcnd.model.reference import reference_logits
from stgcnd.model.spec import ModelSpec
from stgcnd.model.stgcn import motion
from stgcnd.model.synthetic import synthetic_windows
from tests.conftest import write_checkpoint
from tests.model.numpy_reference import motion_np, stream_forward, two_stream_forward

T = 12  # short windows (two stride-2 blocks: 12, 6, 3 frames): these tests are not about T


@pytest.mark.parametrize("formula", ["first-difference", "second-difference"])
@pytest.mark.parametrize("persons,present,width", [(1, 1, "narrow"), (5, 2, "narrow"),
                                                   (1, 1, "original")])
def test_two_stream_matches_numpy_reference(tmp_path, request, formula, persons, present,
                                            width):
    state_fixture = "two_stream_state" if width == "narrow" else "original_state"
    two_stream_state = request.getfixturevalue(state_fixture)
    ckpt = write_checkpoint(tmp_path / "m.pt", two_stream_state)
    model = load_model(ModelSpec(checkpoint=ckpt, persons=persons, frames=T, motion=formula))
    x = synthetic_windows(2, T, persons, present=present, seed=11)
    if persons > 1:
        assert np.all(x[..., present:] == 0)  # empty person slots stay in the average
    got = reference_logits(model, x)
    want = two_stream_forward(two_stream_state, x, formula)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_motion_formulas_match_definitions():
    x = torch.randn(2, 3, 7, 4, 2)
    for formula in ("first-difference", "second-difference"):
        np.testing.assert_allclose(motion(x, formula).numpy(), motion_np(x.numpy(), formula),
                                   atol=1e-6)
    m = motion(x, "first-difference")
    assert torch.equal(m[:, :, 0], torch.zeros_like(m[:, :, 0]))
    assert torch.allclose(m[:, :, 3], x[:, :, 3] - x[:, :, 2])
    m2 = motion(x, "second-difference")
    assert torch.equal(m2[:, :, -1], torch.zeros_like(m2[:, :, -1]))
    assert torch.allclose(m2[:, :, 1], x[:, :, 1] - 0.5 * x[:, :, 2] - 0.5 * x[:, :, 0])


def test_motion_formula_changes_the_output(tmp_path, two_stream_state):
    ckpt = write_checkpoint(tmp_path / "m.pt", two_stream_state)
    x = synthetic_windows(1, T, 1, seed=3)
    a = reference_logits(load_model(ModelSpec(checkpoint=ckpt, frames=T)), x)
    b = reference_logits(load_model(ModelSpec(checkpoint=ckpt, frames=T,
                                              motion="second-difference")), x)
    assert np.abs(a - b).max() > 1e-4


def test_single_stream_checkpoint(tmp_path):
    state = demo_state_dict(two_stream=False, num_class=3, seed=5)
    ckpt = write_checkpoint(tmp_path / "single.pt", state)
    model = load_model(ModelSpec(checkpoint=ckpt, frames=T, labels=("a", "b", "c")))
    assert not model.info.two_stream and model.num_class == 3
    x = synthetic_windows(2, T, 1, seed=1)
    np.testing.assert_allclose(reference_logits(model, x),
                               stream_forward(state, x.astype(np.float64)), atol=1e-4, rtol=1e-4)


def test_graph_ops_compute_the_same_function(checkpoint_path):
    x = synthetic_windows(2, T, 2, seed=9)
    outs = [reference_logits(load_model(ModelSpec(checkpoint=checkpoint_path, frames=T,
                                                  persons=2, graph_op=op)), x)
            for op in ("einsum", "matmul")]
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5)


def test_checkpoint_graph_is_used_not_recomputed(tmp_path, two_stream_state):
    state = dict(two_stream_state)
    for s in ("origin_stream", "motion_stream"):  # a fork's graph: another centre joint
        from stgcnd.model.graph import LAYOUTS, Layout, adjacency
        lay = LAYOUTS["mediapipe"]
        state[f"{s}.A"] = torch.from_numpy(adjacency(Layout("fork", 33, lay.edges, center=24)))
    ckpt = write_checkpoint(tmp_path / "fork.pt", state)
    model = load_model(ModelSpec(checkpoint=ckpt, frames=T))
    assert any("differs" in n for n in model.notes)
    x = synthetic_windows(1, T, 1, seed=2)
    np.testing.assert_allclose(reference_logits(model, x), two_stream_forward(state, x),
                               atol=1e-4, rtol=1e-4)
    default = load_model(ModelSpec(checkpoint=write_checkpoint(tmp_path / "d.pt",
                                                               two_stream_state), frames=T))
    assert default.adjacency_fingerprint != model.adjacency_fingerprint
    assert not any("differs" in n for n in default.notes)


def test_demo_model_is_deterministic_and_says_so():
    a = load_model(ModelSpec(frames=T))
    b = load_model(ModelSpec(frames=T))
    x = synthetic_windows(1, T, 1)
    np.testing.assert_array_equal(reference_logits(a, x), reference_logits(b, x))
    assert any("mean nothing" in n for n in a.notes)
    c = load_model(ModelSpec(frames=T, seed=1))
    assert np.abs(reference_logits(c, x) - reference_logits(a, x)).max() > 1e-3
