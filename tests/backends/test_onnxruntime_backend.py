"""The ONNX Runtime backend on the optimized ONNX graph (exported here, as the store does)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from stgcnd.backends.onnxruntime_backend import OnnxRuntimeBackend
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.export.onnx_export import onnx_bytes
from stgcnd.model import reference_logits
from tests.backends.conftest import resource_counts


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory, small_model) -> Path:
    from stgcnd.model.optimized import optimize_for_export  # torch: small_model needs it too

    path = tmp_path_factory.mktemp("ort") / "opt.onnx"
    path.write_bytes(onnx_bytes(small_model, optimize_for_export(small_model),
                                dynamic_batch=True))
    return path


def _backend(small_model, onnx_path, **kw) -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(onnx_path, small_model.spec.input_shape, small_model.num_class,
                              max_batch=8, **kw)


def test_parity_and_threads(small_model, windows, onnx_path):
    ref = reference_logits(small_model, windows)
    with _backend(small_model, onnx_path, threads=1) as backend, backend.open_session() as s:
        got = s.infer(windows)
        assert backend.info.details["threads"] == 1
        assert backend._shared.get_session_options().intra_op_num_threads == 1
    assert np.max(np.abs(got - ref)) <= 1e-4


def test_concurrent_sessions_match_sequential(small_model, windows, onnx_path):
    with _backend(small_model, onnx_path) as backend:
        with backend.open_session() as s:
            expected = [s.infer(w[None]) for w in windows]
        results: dict[int, list[np.ndarray]] = {}

        def worker(i: int) -> None:
            with backend.open_session() as sess:
                results[i] = [sess.infer(w[None]) for w in windows]

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for outs in results.values():
        for got, want in zip(outs, expected):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert len(results) == 3


def test_thousands_of_sessions_leak_nothing(small_model, onnx_path):
    with _backend(small_model, onnx_path) as backend:
        backend.open_session().close()
        before = resource_counts()
        for _ in range(3000):
            backend.open_session().close()
        assert resource_counts() == before


def test_errors_say_how_to_fix(small_model, tmp_path, onnx_path):
    with pytest.raises(UserError, match="stgcnd build"):
        _backend(small_model, tmp_path / "missing.onnx")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        with pytest.raises(BackendUnavailable, match="onnxruntime-gpu"):
            _backend(small_model, onnx_path, device="cuda")


def test_from_artifact_reads_the_manifest(small_model, windows, onnx_path):
    # The engine store's Artifact fields that the backend reads.
    artifact = SimpleNamespace(
        backend="onnxruntime", precision="fp32", path=onnx_path, onnx_path=onnx_path,
        manifest={"input_shape": list(small_model.spec.input_shape),
                  "num_class": small_model.num_class, "max_batch": 4})
    backend = OnnxRuntimeBackend.from_artifact(artifact, threads=1)
    assert backend.info.max_batch == 4 and backend.info.input_shape == small_model.spec.input_shape
    with backend.open_session() as s:
        assert s.infer(windows[:4]).shape == (4, small_model.num_class)
