"""Checkpoint forms users have, and clear errors for the ones that cannot work."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # an optional extra: pip install -e ".[torch]"

from stgcnd.errors import CheckpointError
from stgcnd.model.demo import demo_state_dict
from stgcnd.model.reference import load_for_inference as load_model
from stgcnd.model.reference import reference_logits
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from tests.conftest import write_checkpoint

T = 12  # short windows: these tests are about loading, not about T


def test_original_checkpoint_has_344_keys(two_stream_state):
    assert len(two_stream_state) == 344
    for key in ("origin_stream.A", "origin_stream.data_bn.running_mean",
                "origin_stream.st_gcn_networks.4.residual.0.weight",
                "motion_stream.edge_importance.9", "motion_stream.fcn.weight"):
        assert key in two_stream_state


@pytest.mark.parametrize("wrap,prefix", [(None, "module."), ("state_dict", ""),
                                         ("model", "module.")])
def test_wrapped_and_prefixed_checkpoints_load_identically(tmp_path, two_stream_state,
                                                           checkpoint_path, wrap, prefix):
    variant = write_checkpoint(tmp_path / "v.pt", two_stream_state, wrap=wrap, prefix=prefix)
    x = synthetic_windows(1, T, 1, seed=4)
    plain = reference_logits(load_model(ModelSpec(checkpoint=checkpoint_path, frames=T)), x)
    got = reference_logits(load_model(ModelSpec(checkpoint=variant, frames=T)), x)
    np.testing.assert_array_equal(plain, got)


def test_checkpoint_without_num_batches_tracked_loads(tmp_path, two_stream_state):
    old = {k: v for k, v in two_stream_state.items() if not k.endswith("num_batches_tracked")}
    load_model(ModelSpec(checkpoint=write_checkpoint(tmp_path / "old.pt", old), frames=T))


def test_loading_warns_of_nothing_the_user_cannot_act_on(checkpoint_path):
    """torch 2.0/2.1 (JetPack 5; CI's Python 3.8 stage) warn "TypedStorage is deprecated"
    from inside their own weights-only load: it would reach the daemon's log."""
    from stgcnd.model.checkpoint import read_state_dict

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_state_dict(checkpoint_path)
    assert not [w for w in caught if "TypedStorage" in str(w.message)], caught


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_model(ModelSpec(checkpoint=tmp_path / "nope.pt"))


def test_truncated_checkpoint(tmp_path, checkpoint_path):
    cut = tmp_path / "cut.pt"
    cut.write_bytes(checkpoint_path.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_model(ModelSpec(checkpoint=cut))


def test_garbage_file(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"this is not a checkpoint" * 10)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_model(ModelSpec(checkpoint=bad))


def test_pickled_module_is_refused_with_advice(tmp_path):
    path = tmp_path / "whole.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(CheckpointError, match="state_dict"):
        load_model(ModelSpec(checkpoint=path))


def test_wrong_joint_count_names_the_layout(tmp_path):
    state = demo_state_dict("openpose", seed=1)
    path = write_checkpoint(tmp_path / "op.pt", state)
    with pytest.raises(CheckpointError, match=r"18 joints.*--layout openpose"):
        load_model(ModelSpec(checkpoint=path, layout="mediapipe"))
    load_model(ModelSpec(checkpoint=path, layout="openpose", frames=T))


def test_wrong_label_count(checkpoint_path):
    with pytest.raises(CheckpointError, match="2 classes but 3 labels"):
        load_model(ModelSpec(checkpoint=checkpoint_path, labels=("a", "b", "c")))


def test_class_count_comes_from_checkpoint(tmp_path):
    path = write_checkpoint(tmp_path / "c5.pt", demo_state_dict(num_class=5, seed=2))
    model = load_model(ModelSpec(checkpoint=path, frames=T))
    assert model.num_class == 5
    assert reference_logits(model, synthetic_windows(1, T, 1)).shape == (1, 5)


def test_missing_and_unexpected_keys_are_named(tmp_path, two_stream_state):
    state = dict(two_stream_state)
    del state["motion_stream.fcn.bias"]
    state["origin_stream.extra.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"motion_stream\.fcn\.bias.*origin_stream\.extra"):
        load_model(ModelSpec(checkpoint=write_checkpoint(tmp_path / "k.pt", state)))


def test_shape_mismatch_is_named(tmp_path, two_stream_state):
    state = dict(two_stream_state)
    state["origin_stream.st_gcn_networks.3.tcn.2.weight"] = torch.zeros(64, 64, 5, 1)
    with pytest.raises(CheckpointError, match=r"tcn\.2\.weight: checkpoint \(64, 64, 5, 1\)"):
        load_model(ModelSpec(checkpoint=write_checkpoint(tmp_path / "s.pt", state)))


def test_one_stream_missing(tmp_path, two_stream_state):
    state = {k: v for k, v in two_stream_state.items() if k.startswith("origin_stream.")}
    with pytest.raises(CheckpointError, match="streams is missing"):
        load_model(ModelSpec(checkpoint=write_checkpoint(tmp_path / "o.pt", state)))


def test_other_architecture(tmp_path):
    path = write_checkpoint(tmp_path / "resnet.pt", torch.nn.Conv2d(3, 8, 3).state_dict())
    with pytest.raises(CheckpointError, match="not an st-gcn model"):
        load_model(ModelSpec(checkpoint=path))


def test_a_person_count_fold_in_data_bn_is_named():
    from stgcnd.model.checkpoint import CheckpointInfo, check_against_spec

    info = CheckpointInfo(two_stream=True, num_class=2, partitions=3, num_node=33,
                          in_channels=15, edge_importance=True, adjacency={})
    with pytest.raises(CheckpointError, match=r"expects 15 input channels.*5 persons.*"
                                              r"person-count fold"):
        check_against_spec(info, "mediapipe", (), "fork.pt")
