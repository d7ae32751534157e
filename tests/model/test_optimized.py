"""The inference-optimized network computes the same function as the plain one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")  # an optional extra: pip install -e ".[torch]"

from stgcnd.model.demo import demo_state_dict
from stgcnd.model.optimized import optimize
from stgcnd.model.reference import load_for_inference as load_model
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from tests.conftest import write_checkpoint


@pytest.mark.parametrize("form", ["channels_last", "nchw"])
@pytest.mark.parametrize("persons,two_stream", [(1, True), (5, True), (1, False)])
def test_fused_equals_plain(tmp_path, form, persons, two_stream):
    state = demo_state_dict(two_stream=two_stream, seed=13)
    model = load_model(ModelSpec(checkpoint=write_checkpoint(tmp_path / "m.pt", state),
                                 persons=persons, frames=12, motion="second-difference"))
    fused = optimize(model.module, form)
    x = torch.from_numpy(synthetic_windows(3, 12, persons, present=min(persons, 2), seed=1))
    with torch.inference_mode():
        diff = (fused(x) - model.module(x)).abs().max().item()
    assert diff <= 1e-4
    names = [type(m).__name__ for m in fused.modules()]
    assert "BatchNorm2d" not in names and "BatchNorm1d" not in names
