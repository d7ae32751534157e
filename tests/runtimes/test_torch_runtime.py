"""The torch runtime on the CPU: parity with the fp32 reference, precisions, its runners (a
HostRunner on a worker thread) and their resources."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("torch")  # an optional extra: pip install -e ".[torch]"

from stgcnd.errors import BackendUnavailable
from stgcnd.model.reference import reference_logits
from stgcnd.runtimes.base import HostRunner, InWorker
from stgcnd.runtimes.torch_runtime import TorchRuntime
from tests.runtimes.conftest import assert_released, opened, resource_counts


def test_fp32_cpu_matches_reference(small_model, windows):
    ref = reference_logits(small_model, windows)
    with TorchRuntime(small_model, "fp32", "cpu", max_batch=8) as runtime, \
            opened(runtime, (1, 2, 4, 8), lanes=4) as runner:
        # A CPU computes on the calling thread: its runner runs on a worker of its own.
        assert isinstance(runner, InWorker) and isinstance(runner.inner, HostRunner)
        assert runner.buckets == tuple(range(1, 9))   # no padding on a CPU
        got = runner.run(list(windows))
        one = np.concatenate([runner.run([w]) for w in windows])
        assert set(runner.last_timings) >= {"compute_ms", "total_ms"}
    assert got.shape == (len(windows), small_model.num_class) and got.dtype == np.float32
    assert np.max(np.abs(got - ref)) <= 1e-4
    assert np.max(np.abs(one - ref)) <= 1e-4
    assert runtime.info.details["variant"] == "optimized"
    assert runtime.info.name == "torch" and runtime.info.device == "cpu"


def test_float16_windows_are_accepted(small_model, windows):
    ref = reference_logits(small_model, windows.astype(np.float16).astype(np.float32))
    with TorchRuntime(small_model, "fp32", "cpu", max_batch=8) as runtime, \
            opened(runtime, (8,)) as runner:
        got = runner.run(list(windows.astype(np.float16)))
    assert got.dtype == np.float32
    assert np.max(np.abs(got - ref)) <= 1e-4


def test_eager_variant_is_the_plain_network(small_model, windows):
    ref = reference_logits(small_model, windows)
    with TorchRuntime(small_model, "fp32", "cpu", max_batch=8, optimized=False) as runtime, \
            opened(runtime, (8,)) as runner:
        assert runtime.module is small_model.module
        assert runtime.info.details["variant"] == "eager"
        assert np.array_equal(runner.run(list(windows)), ref)


def test_unsupported_precisions_are_clear_errors(small_model):
    with pytest.raises(BackendUnavailable, match="fp16 needs CUDA"):
        TorchRuntime(small_model, "fp16", "cpu")
    with pytest.raises(BackendUnavailable, match="int8"):
        TorchRuntime(small_model, "int8", "cpu")
    # Refused before any CUDA call: the same answer with or without a GPU.
    with pytest.raises(BackendUnavailable, match="use fp16 on CUDA"):
        TorchRuntime(small_model, "bf16", "cuda")


def test_bf16_cpu_keeps_the_prediction(small_model, windows):
    ref = reference_logits(small_model, windows)
    with TorchRuntime(small_model, "bf16", "cpu", max_batch=8) as runtime, \
            opened(runtime, (8,)) as runner:
        got = runner.run(list(windows))
    # bf16 keeps 8 mantissa bits: under a tenth of the logits' range, the same decisions.
    scale = np.max(np.abs(ref))
    assert np.max(np.abs(got - ref)) <= 0.1 * scale
    assert np.array_equal(got.argmax(1), ref.argmax(1))


def test_batch_checks(small_model, windows):
    """Too many windows, none, or a lane count that does not match are refused in the
    caller's thread; a window of the wrong shape fails in the worker and is raised on
    collect, and the runner goes on serving."""
    ref = reference_logits(small_model, windows)
    with TorchRuntime(small_model, "fp32", "cpu", max_batch=2) as runtime, \
            opened(runtime, (1, 2), lanes=2) as runner:
        with pytest.raises(ValueError, match=r"1\.\.2 windows"):
            runner.run(list(windows[:3]))
        with pytest.raises(ValueError):
            runner.run([])
        with pytest.raises(ValueError, match="one lane each"):
            runner.run(list(windows[:2]), lanes=[0])
        with pytest.raises(ValueError, match="broadcast"):
            runner.run([windows[0, :, :10]])
        np.testing.assert_allclose(runner.run(list(windows[:2])), ref[:2], atol=1e-4)


def test_concurrent_runners_match_one_at_a_time(small_model, windows):
    """Several executors' runners over one runtime (its network shared), each driven from a
    thread of its own at the same time."""
    with TorchRuntime(small_model, "fp32", "cpu", max_batch=8) as runtime:
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
    assert sorted(results) == [0, 1, 2]
    for outs in results.values():
        for j, got in enumerate(outs):
            np.testing.assert_array_equal(got, expected[j % len(windows)])


@pytest.mark.parametrize("count", [10, pytest.param(100, marks=pytest.mark.slow)])
def test_runners_leak_nothing(small_model, windows, count):
    """Each runner has a worker thread; closing it ends the thread (a reload opens new
    runners and closes the old ones). Counts must come back exactly: ten runners show a leak
    of one per runner, a hundred (the slow tier) one per few runners too."""
    with TorchRuntime(small_model, "fp32", "cpu") as runtime:
        with opened(runtime) as runner:
            runner.run([windows[0]])
        before = resource_counts()
        for _ in range(count):
            runner = runtime.open_runner((1,), 0)
            runner.run([windows[0]])
            runner.close()
            assert not runner._thread.is_alive()
        assert_released(before)
    assert runtime.module is None  # the runtime's weights are released on close
