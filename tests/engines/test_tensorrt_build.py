"""A real TensorRT build through the store (GPU machines with TensorRT only)."""

from __future__ import annotations

import pytest

from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from tests.engines.conftest import demo_spec

pytestmark = pytest.mark.tensorrt


@pytest.fixture(scope="module", autouse=True)
def _needs_tensorrt_and_gpu():
    pytest.importorskip("tensorrt")
    from stgcnd.engines.device import gpu_identity

    if gpu_identity() is None:
        pytest.skip("needs a CUDA GPU")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_build_then_reuse(tmp_path, precision):
    import tensorrt as trt

    from stgcnd.engines.builders.tensorrt import precision_plan
    from stgcnd.errors import UserError

    try:
        precision_plan(trt, precision)
    except UserError as exc:
        pytest.skip(str(exc))
    store = EngineStore(tmp_path / "engines")
    opts = BuildOptions(precision=precision, device="cuda", workspace_mb=512, opt_level=1)
    built = store.prepare(demo_spec(), "tensorrt", opts)
    assert not built.reused and built.path.stat().st_size > 0
    v = built.manifest["validation"]
    if "top1_agreement" in v:
        assert v["top1_agreement"] == 1.0
    assert (tmp_path / "engines" / "timing-cache").glob("tensorrt-*.cache")
    again = store.prepare(demo_spec(), "tensorrt", opts)
    assert again.reused and again.path == built.path
