"""`auto` on a machine without a GPU: the faster CPU backend, measured once and remembered."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # an optional extra: pip install -e ".[torch]"

from stgcnd.backends.registry import AUTO_CACHE_NAME, open_backend
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.model import ModelSpec, load_model, reference_logits
from stgcnd.model.synthetic import synthetic_windows


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU, auto picks a GPU backend")
def test_auto_measures_both_cpu_backends_and_remembers(tmp_path):
    model = load_model(ModelSpec(frames=30))
    store = EngineStore(tmp_path / "engines")
    backend = open_backend(model, "auto", BuildOptions(), store)
    try:
        assert backend.info.name in ("torch", "onnxruntime") and backend.info.device == "cpu"
        x = synthetic_windows(2, 30, 1, seed=4)
        with backend.open_session() as s:
            got = np.concatenate([s.infer(w[None]) for w in x])  # max_batch 1 by default
            np.testing.assert_allclose(got, reference_logits(model, x), atol=1e-4)
    finally:
        backend.close()
    cache_path = tmp_path / "engines" / AUTO_CACHE_NAME
    (entry,) = json.loads(cache_path.read_text()).values()
    timings = entry["median_ms"]
    assert set(timings) == {"torch", "onnxruntime"} and all(v > 0 for v in timings.values())
    assert entry["backend"] == min(timings, key=timings.__getitem__)

    # The decision is read back, not re-measured: flip it on disk and it is honoured.
    other = "torch" if entry["backend"] == "onnxruntime" else "onnxruntime"
    cache = json.loads(cache_path.read_text())
    next(iter(cache.values()))["backend"] = other
    cache_path.write_text(json.dumps(cache))
    again = open_backend(model, "auto", BuildOptions(), store)
    try:
        assert again.info.name == other
    finally:
        again.close()
