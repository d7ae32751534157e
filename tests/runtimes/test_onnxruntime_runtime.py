"""The ONNX Runtime runtime on the optimized ONNX graph (exported here, as the store does):
parity with the fp32 reference, its runners (a HostRunner on a worker thread), their
resources, and the errors that say how to fix a missing model or provider."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from stgcnd.engines.builders import get_builder
from stgcnd.engines.options import BuildOptions
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.export.onnx_export import onnx_bytes
from stgcnd.model.reference import reference_logits
from stgcnd.runtimes.base import HostRunner, InWorker
from stgcnd.runtimes.onnxruntime_runtime import OnnxRuntimeRuntime
from tests.runtimes.conftest import assert_released, opened, resource_counts


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory, small_model) -> Path:
    from stgcnd.model.optimized import optimize_for_export  # torch: small_model needs it too

    path = tmp_path_factory.mktemp("ort") / "opt.onnx"
    path.write_bytes(onnx_bytes(small_model, optimize_for_export(small_model),
                                dynamic_batch=True))
    return path


def _runtime(small_model, onnx_path, **kw) -> OnnxRuntimeRuntime:
    return OnnxRuntimeRuntime(onnx_path, small_model.spec.input_shape, small_model.num_class,
                              max_batch=8, **kw)


def test_parity_and_threads(small_model, windows, onnx_path):
    ref = reference_logits(small_model, windows)
    with _runtime(small_model, onnx_path, threads=1) as runtime, \
            opened(runtime, (1, 2, 4, 8), lanes=4) as runner:
        assert isinstance(runner, InWorker) and isinstance(runner.inner, HostRunner)
        assert runner.buckets == tuple(range(1, 9))   # no padding on a CPU
        got = runner.run(list(windows))
        halves = np.concatenate([runner.run(list(windows[:3])), runner.run([windows[3]])])
        assert set(runner.last_timings) >= {"compute_ms", "total_ms"}
        assert runtime.info.details["threads"] == 1
        assert runtime.session.get_session_options().intra_op_num_threads == 1
        assert runtime.info.details["providers"] == ["CPUExecutionProvider"]
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.max(np.abs(got - ref)) <= 1e-4
    assert np.max(np.abs(halves - ref)) <= 1e-4
    assert runtime.session is None  # released on close


def test_float16_windows_are_accepted(small_model, windows, onnx_path):
    ref = reference_logits(small_model, windows.astype(np.float16).astype(np.float32))
    with _runtime(small_model, onnx_path) as runtime, opened(runtime, (8,)) as runner:
        got = runner.run(list(windows.astype(np.float16)))
    assert np.max(np.abs(got - ref)) <= 1e-4


def test_concurrent_runners_match_sequential(small_model, windows, onnx_path):
    """Runners share the runtime's one InferenceSession; each is driven from its own thread."""
    with _runtime(small_model, onnx_path) as runtime:
        with opened(runtime) as runner:
            expected = [runner.run([w]) for w in windows]
        runners = [runtime.open_runner((1,), 0) for _ in range(3)]
        results: dict[int, list[np.ndarray]] = {}
        errors: list[BaseException] = []

        def drive(i: int) -> None:
            try:
                results[i] = [runners[i].run([w]) for _ in range(3) for w in windows]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for runner in runners:
            runner.close()
    assert not errors, errors
    assert len(results) == 3
    for outs in results.values():
        for j, got in enumerate(outs):
            np.testing.assert_allclose(got, expected[j % len(windows)], rtol=0, atol=1e-6)


# Counts must come back exactly, so ten runners show a leak of one per runner; a hundred
# (the slow tier) show one per few runners too.
@pytest.mark.parametrize("count", [10, pytest.param(100, marks=pytest.mark.slow)])
def test_runners_leak_nothing(small_model, windows, onnx_path, count):
    with _runtime(small_model, onnx_path) as runtime:
        with opened(runtime) as runner:
            runner.run([windows[0]])
        before = resource_counts()
        for _ in range(count):
            with opened(runtime) as runner:
                runner.run([windows[0]])
        assert_released(before)


def test_errors_say_how_to_fix(small_model, tmp_path, onnx_path):
    with pytest.raises(UserError, match="stgcnd build"):
        _runtime(small_model, tmp_path / "missing.onnx")
    with pytest.raises(UserError, match="unknown device"):
        _runtime(small_model, onnx_path, device="tpu")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        with pytest.raises(BackendUnavailable, match="onnxruntime-gpu"):
            _runtime(small_model, onnx_path, device="cuda")


def test_loaded_from_a_stored_artefact_reads_the_manifest(small_model, windows, onnx_path):
    # The engine store's Artifact fields that the loader reads.
    artifact = SimpleNamespace(
        backend="onnxruntime", precision="fp32", path=onnx_path, onnx_path=onnx_path,
        manifest={"input_shape": list(small_model.spec.input_shape),
                  "num_class": small_model.num_class, "max_batch": 4})
    runtime = get_builder("onnxruntime").open(artifact, BuildOptions(threads=1), None,
                                              onnx_path.parent)
    try:
        assert isinstance(runtime, OnnxRuntimeRuntime)
        assert runtime.info.max_batch == 4
        assert runtime.info.input_shape == small_model.spec.input_shape
        assert runtime.info.artifact == str(onnx_path) and runtime.info.details["threads"] == 1
        with opened(runtime, (8,)) as runner:
            assert runner.max_batch == 4   # bounded by the artefact, whatever is asked
            out = runner.run(list(windows[:4]))
        assert out.shape == (4, small_model.num_class)
    finally:
        runtime.close()
