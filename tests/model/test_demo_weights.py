"""The demo model's numpy weights: torch-free, and the very tensors the PyTorch network loads."""

from __future__ import annotations

import numpy as np
import pytest

from stgcnd.model.architecture import WIDTHS, state_widths, stream_state_layout
from stgcnd.model.demo import demo_arrays
from stgcnd.model.folded import fold_state, folded_logits
from stgcnd.model.numpy_demo import load_numpy_demo
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from tests.conftest import NARROW
from tests.model.numpy_reference import two_stream_forward


@pytest.mark.parametrize("edge_importance,widths", [(True, WIDTHS), (False, WIDTHS),
                                                    (True, NARROW)])
def test_state_layout_is_the_torch_modules_own(edge_importance, widths):
    """The weights are drawn in this order: it must be exactly what state_dict() lists, and
    a state's widths are read back from its tensors."""
    torch = pytest.importorskip("torch")
    from stgcnd.model.graph import adjacency
    from stgcnd.model.stgcn import STGCN

    a = adjacency("mediapipe")
    module = STGCN(torch.from_numpy(a), 4, 3, edge_importance, widths=widths)
    want = [(k, tuple(v.shape)) for k, v in module.state_dict().items()]
    assert stream_state_layout(3, 33, 4, 3, edge_importance, widths) == want
    assert state_widths(module.state_dict()) == widths


def test_demo_state_dict_loads_strictly_and_equals_the_arrays():
    torch = pytest.importorskip("torch")
    from stgcnd.model.demo import demo_state_dict
    from stgcnd.model.stgcn import TwoStreamSTGCN

    arrays = demo_arrays(seed=3)
    state = demo_state_dict(seed=3)
    assert list(state) == list(arrays)
    for key, value in state.items():
        np.testing.assert_array_equal(value.numpy(), arrays[key])
    net = TwoStreamSTGCN(state["origin_stream.A"], 2)
    net.load_state_dict(state, strict=True)
    assert state["origin_stream.data_bn.num_batches_tracked"].dtype == torch.long


def test_same_seed_same_bytes_other_seed_other_weights():
    a, b, c = demo_arrays(seed=1), demo_arrays(seed=1), demo_arrays(seed=2)
    key = "motion_stream.st_gcn_networks.9.tcn.2.weight"
    assert a[key].dtype == np.float32 and a[key].tobytes() == b[key].tobytes()
    assert not np.array_equal(a[key], c[key])


@pytest.mark.parametrize("formula", ["first-difference", "second-difference"])
def test_folded_numpy_forward_matches_the_independent_reference(formula):
    """Folding BN and the channels-last forward change nothing beyond float rounding."""
    state = demo_arrays(seed=4)
    x = synthetic_windows(2, 12, 2, present=1, seed=8)
    got = folded_logits(fold_state(state), x, formula)
    want = two_stream_forward(state, x, formula)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_single_stream_folds_too():
    state = demo_arrays(two_stream=False, num_class=3, seed=5)
    x = synthetic_windows(2, 12, 1, seed=2)
    from tests.model.numpy_reference import stream_forward

    np.testing.assert_allclose(folded_logits(fold_state(state), x), stream_forward(state, x),
                               atol=1e-4, rtol=1e-4)


def test_numpy_demo_model_stands_in_for_a_loaded_model():
    spec = ModelSpec(frames=12)
    model = load_numpy_demo(spec)
    assert model.module is None and model.checkpoint_sha256 is None
    assert model.num_class == 2 and model.labels == ("normal", "abnormal")
    assert model.describe()["demo"] is True
    x = synthetic_windows(3, 12, 1, seed=6)
    np.testing.assert_allclose(model.reference_logits(x),
                               two_stream_forward(demo_arrays(seed=spec.seed), x),
                               atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="demo model only"):
        load_numpy_demo(ModelSpec(checkpoint="x.pt"))
