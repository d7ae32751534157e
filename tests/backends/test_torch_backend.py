"""The torch backend on the CPU: parity, precisions, sessions and their resources."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

pytest.importorskip("torch")  # an optional extra: pip install -e ".[torch]"

from stgcnd.backends.torch_backend import TorchBackend
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.model import reference_logits
from tests.backends.conftest import resource_counts


def test_fp32_cpu_matches_reference(small_model, windows):
    ref = reference_logits(small_model, windows)
    with TorchBackend(small_model, "fp32", "cpu", max_batch=8) as backend, \
            backend.open_session() as s:
        got = s.infer(windows)
        one = np.concatenate([s.infer(w[None]) for w in windows])
        assert set(s.last_timings) >= {"compute_ms", "total_ms"}
    assert got.shape == (len(windows), small_model.num_class) and got.dtype == np.float32
    assert np.max(np.abs(got - ref)) <= 1e-4
    assert np.max(np.abs(one - ref)) <= 1e-4
    assert backend.info.details["variant"] == "optimized"


def test_float16_windows_are_accepted(small_model, windows):
    ref = reference_logits(small_model, windows.astype(np.float16).astype(np.float32))
    with TorchBackend(small_model, "fp32", "cpu", max_batch=8) as backend, \
            backend.open_session() as s:
        got = s.infer(windows.astype(np.float16))
    assert np.max(np.abs(got - ref)) <= 1e-4


def test_eager_variant_is_the_plain_network(small_model, windows):
    ref = reference_logits(small_model, windows)
    with TorchBackend(small_model, "fp32", "cpu", max_batch=8, optimized=False) as backend, \
            backend.open_session() as s:
        assert backend.module is small_model.module
        assert np.array_equal(s.infer(windows), ref)


def test_fp16_on_cpu_is_a_clear_error(small_model):
    with pytest.raises(BackendUnavailable, match="fp16 needs CUDA"):
        TorchBackend(small_model, "fp16", "cpu")
    with pytest.raises(BackendUnavailable, match="int8"):
        TorchBackend(small_model, "int8", "cpu")


def test_bf16_cpu_keeps_the_prediction(small_model, windows):
    ref = reference_logits(small_model, windows)
    with TorchBackend(small_model, "bf16", "cpu", max_batch=8) as backend, \
            backend.open_session() as s:
        got = s.infer(windows)
    # bf16 keeps 8 mantissa bits: under a tenth of the logits' range, the same decisions.
    scale = np.max(np.abs(ref))
    assert np.max(np.abs(got - ref)) <= 0.1 * scale
    assert np.array_equal(got.argmax(1), ref.argmax(1))


def test_batch_checks(small_model, windows):
    with TorchBackend(small_model, "fp32", "cpu", max_batch=2) as backend, \
            backend.open_session() as s:
        with pytest.raises(UserError, match="batch size 3"):
            s.infer(windows[:3])
        with pytest.raises(UserError, match="shape"):
            s.infer(windows[:1, :, :10])
        with pytest.raises(UserError, match="float32 or float16"):
            s.infer(windows[:1].astype(np.float64))


def test_concurrent_sessions_match_one_at_a_time(small_model, windows):
    with TorchBackend(small_model, "fp32", "cpu", max_batch=8) as backend:
        with backend.open_session() as s:
            expected = [s.infer(w[None]) for w in windows]
        results: dict[int, list[np.ndarray]] = {}

        def worker(i: int) -> None:
            with backend.open_session() as sess:
                results[i] = [sess.infer(windows[j][None]) for j in range(len(windows))]

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(results) == [0, 1, 2]
    for outs in results.values():
        for got, want in zip(outs, expected):
            np.testing.assert_array_equal(got, want)


def test_a_session_refuses_a_second_thread(small_model, windows):
    with TorchBackend(small_model, "fp32", "cpu") as backend, backend.open_session() as s:
        s._busy.acquire()  # as if another thread were inside infer
        try:
            with pytest.raises(RuntimeError, match="one thread at a time"):
                s.infer(windows[:1])
        finally:
            s._busy.release()


def test_thousands_of_sessions_leak_nothing(small_model):
    with TorchBackend(small_model, "fp32", "cpu") as backend:
        with backend.open_session():
            pass
        before = resource_counts()
        refs = []
        for _ in range(3000):
            s = backend.open_session()
            refs.append(weakref.ref(s))
            s.close()
            assert s.closed
        del s
        gc.collect()
        assert not [r for r in refs if r() is not None]
        assert resource_counts() == before
    with pytest.raises(RuntimeError, match="closed"):
        closed = TorchBackend(small_model, "fp32", "cpu").open_session()
        closed.close()
        closed.infer(np.zeros((1, *small_model.spec.input_shape), np.float32))
