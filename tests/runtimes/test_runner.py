"""Batch runners of the torch runtime (an executor's prepared resources): every window of a
batch gets its own answer, padded buckets included; on CUDA with per-client lanes, one graph
per bucket, the fallbacks without graphs, and graphs captured while another runner replays
(a reload under load).

The CPU tests run everywhere; the CUDA ones on the GPU test machine (`pytest -m gpu`).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stgcnd.model.reference import reference_logits
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.runtimes.base import HostRunner, InWorker, normalize_buckets
from stgcnd.runtimes.torch_runtime import TorchRuntime
from tests.runtimes.conftest import assert_released, fp16_tol, parity_tol, resource_counts

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def batch(small_model):
    spec = small_model.spec
    return synthetic_windows(7, spec.frames, spec.persons, spec.num_node, seed=31)


def test_buckets_always_cover_every_batch_size():
    assert normalize_buckets((1, 2, 4, 8, 16, 32, 64), 16) == (1, 2, 4, 8, 16)
    assert normalize_buckets((4,), 8) == (1, 4)          # 1 is always there
    assert normalize_buckets((64,), 16) == (1, 16)       # clipped to what the runtime takes
    assert normalize_buckets((3, 3, 2), 1) == (1,)
    assert normalize_buckets((), 8) == (1,)


def test_cpu_runner_parity_and_estimates(small_model, batch):
    ref = reference_logits(small_model, batch)
    with TorchRuntime(small_model, "fp32", "cpu", max_batch=8) as runtime:
        runner = runtime.open_runner((1, 2, 4, 8), lanes=4)
        try:
            est = runner.warm_up(1)
            assert runner.buckets == tuple(range(1, 9))   # CPU: no padding, every size
            # A CPU's cost is linear in the batch: batch 1 is measured and scaled.
            assert sorted(est) == list(range(1, 9))
            assert est[4] == pytest.approx(4 * est[1])
            assert runner.wall_ms[8] == pytest.approx(8 * runner.wall_ms[1])
            assert runner.compute_ms == est
            out = runner.run(list(batch[:5]), [0, 1, 2, 3, 0])
            assert out.shape == (5, ref.shape[1])
            np.testing.assert_allclose(out, ref[:5], atol=1e-4)
            one = runner.run([batch[6]], [2])
            np.testing.assert_allclose(one[0], ref[6], atol=1e-4)
            with pytest.raises(ValueError):
                runner.run(list(batch[:2]), [0])          # one lane per window
        finally:
            runner.close()


def test_cpu_runner_close_ends_its_worker(small_model, batch):
    # The worker thread holds the runner's buffers; a reload must free them.
    with TorchRuntime(small_model, "fp32", "cpu", max_batch=2) as runtime:
        runner = runtime.open_runner((1, 2), lanes=0)
        runner.run([batch[0]])   # a warm runner, so that nothing is left to start lazily
        before = resource_counts()
        other = runtime.open_runner((1, 2), lanes=0)
        other.run([batch[0]])
        assert isinstance(other, InWorker) and other._thread.is_alive()
        assert resource_counts()["threads"] == before["threads"] + 1
        other.close()
        assert not other._thread.is_alive()
        assert_released(before)
        runner.close()


def test_capture_mode_is_the_one_this_torch_has():
    """torch 2.1 added capture_error_mode; JetPack 5's torch 2.0 captures globally only, and
    passing the keyword there was a TypeError (CI's Python 3.8 stage runs torch 2.0.1)."""
    from stgcnd.runtimes import torch_runtime

    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    want = "thread_local" if (major, minor) >= (2, 1) else "global"
    assert want == torch_runtime.CAPTURE_MODE


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [0, 8])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_runner_parity_padded_buckets_and_lanes(small_model, batch, lanes, precision):
    from stgcnd.runtimes.torch_runtime import CudaGraphRunner

    ref = reference_logits(small_model, batch)
    tol = parity_tol(precision, ref)
    with TorchRuntime(small_model, precision, "cuda", cuda_graph=True,
                      max_batch=8) as runtime:
        runner = runtime.open_runner((1, 2, 4, 8), lanes=lanes)
        try:
            assert isinstance(runner, CudaGraphRunner)
            assert sorted(runner.graphs) == [1, 2, 4, 8]      # all captured up front
            est = runner.warm_up(2)
            assert set(est) == {1, 2, 4, 8} and all(v > 0 for v in est.values())
            lane_ids = [0, 3, 3, 7, 1, 2, 5] if lanes else [0] * 7   # lane 3 twice
            full = runner.run(list(batch), lane_ids)           # 7 in bucket 8 (padded)
            three = runner.run(list(batch[:3]), lane_ids[:3])  # 3 in bucket 4
            again = runner.run(list(batch), lane_ids)
            half = runner.run(list(batch[:2].astype(np.float16)), lane_ids[:2])
            assert "compute_ms" in runner.last_timings
        finally:
            runner.close()
    assert np.max(np.abs(full - ref)) <= tol
    assert np.max(np.abs(three - ref[:3])) <= tol
    np.testing.assert_allclose(full, again, rtol=0, atol=tol / 100)
    ref16 = reference_logits(small_model, batch[:2].astype(np.float16).astype(np.float32))
    assert np.max(np.abs(half - ref16)) <= tol


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("how", ["eager", "capture-fails"])
def test_cuda_runner_fallbacks_give_the_same_answers(small_model, batch, how, monkeypatch):
    """The two ways a batch runs on CUDA without graphs, on a worker thread: graphs not
    asked for (cuda_graph = false), and a capture that fails (as trtexec does: said once,
    then every batch computed eagerly)."""
    from structlog.testing import capture_logs

    from stgcnd.runtimes import torch_runtime

    if how == "capture-fails":
        def refuse(*args, **kw):
            raise RuntimeError("operation not permitted when stream is capturing")

        monkeypatch.setattr(torch_runtime, "_graph_capture", refuse)
    ref = reference_logits(small_model, batch)
    with TorchRuntime(small_model, "fp32", "cuda", cuda_graph=how != "eager",
                      max_batch=8) as runtime, capture_logs() as logs:
        runner = runtime.open_runner((1, 2, 4, 8), lanes=4)
        try:
            assert isinstance(runner, InWorker) and isinstance(runner.inner, HostRunner)
            runner.warm_up(1)
            outs = [runner.run(list(batch[:n]), [i % 4 for i in range(n)]) for n in (7, 3, 1)]
        finally:
            runner.close()
    warned = [e for e in logs if e["event"] == "cuda_graph_unavailable"]
    assert len(warned) == (1 if how == "capture-fails" else 0)
    for out in outs:
        np.testing.assert_allclose(out, ref[:len(out)], atol=1e-4)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["thread_local", "global"])
def test_capturing_a_new_runner_while_another_replays(small_model, batch, mode, monkeypatch):
    """A reload prepares new runners (graph captures) while the old ones serve: this crashed
    the per-camera design ("Cannot prepare for replay during capturing stage"). "global" is
    torch 2.0's only capture mode (JetPack 5), asked of this torch explicitly: the serving
    runner, polled as the I/O loop does, must then keep off the device during captures."""
    from stgcnd.runtimes import torch_runtime

    monkeypatch.setattr(torch_runtime, "CAPTURE_MODE", mode)
    ref = reference_logits(small_model, batch)
    with TorchRuntime(small_model, "fp16", "cuda", cuda_graph=True, max_batch=8) as runtime:
        serving = runtime.open_runner((1, 2, 4, 8), lanes=4)
        attached, stop = threading.Event(), threading.Event()
        errors: list[BaseException] = []
        worst = [0.0]
        turns = [0]

        def serve() -> None:
            try:
                serving.attach()   # as the I/O loop does, before its first launch
                attached.set()
                while not stop.is_set():
                    turns[0] += 1
                    if turns[0] % 2:
                        out = serving.run(list(batch[:4]), [0, 1, 2, 3])
                    else:  # as the I/O loop drives it: launch, poll done, collect
                        while not serving.can_launch():
                            pass
                        serving.launch(list(batch[:4]), [0, 1, 2, 3])
                        while not serving.done():
                            pass
                        out = serving.collect()
                    worst[0] = max(worst[0], float(np.max(np.abs(out - ref[:4]))))
            except BaseException as exc:
                errors.append(exc)
            finally:
                attached.set()

        t = threading.Thread(target=serve)
        t.start()
        try:
            assert attached.wait(60)
            for _ in range(3):   # three reloads' worth of captures
                fresh = runtime.open_runner((1, 2, 4, 8), lanes=4)
                out = fresh.run(list(batch), [0, 1, 2, 3, 0, 1, 2])
                fresh.close()
                assert np.max(np.abs(out - ref)) <= fp16_tol(ref)
        finally:
            stop.set()
            t.join(60)
            serving.close()
    assert not errors, errors
    assert turns[0] > 1
    assert worst[0] <= fp16_tol(ref)


@gpu
@pytest.mark.gpu
def test_instances_prepared_in_turn_and_driven_at_once(small_model, batch):
    """`instances = 2` or more: the loading thread prepares each executor's runner in turn;
    then each is driven by a thread of its own at the same time, never mixing their
    buffers."""
    ref = reference_logits(small_model, batch)
    with TorchRuntime(small_model, "fp16", "cuda", cuda_graph=True, max_batch=8) as runtime:
        runners = [runtime.open_runner((1, 2, 4, 8), lanes=4) for _ in range(3)]
        outs: list[np.ndarray] = []
        errors: list[BaseException] = []

        def executor(runner) -> None:
            try:
                runner.attach()
                runner.warm_up(1)
                for _ in range(5):
                    outs.append(runner.run(list(batch), [0, 1, 2, 3, 0, 1, 2]))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=executor, args=(r,)) for r in runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for runner in runners:
            runner.close()
    assert not errors, errors
    assert len(outs) == 15
    for out in outs:
        assert np.max(np.abs(out - ref)) <= fp16_tol(ref)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [0, 8])
def test_cuda_runner_launch_only_enqueues_and_collects_the_same_answers(small_model, batch,
                                                                       lanes):
    """The loop-driven form: launch returns before the device is done, done() says when,
    collect() gives what run() gives; also when another thread than the maker drives it (the
    I/O loop drives runners made by the start-up or reload thread)."""
    from stgcnd.runtimes.torch_runtime import CudaGraphRunner

    ref = reference_logits(small_model, batch)
    lane_ids = [0, 3, 3, 7, 1, 2, 5] if lanes else [0] * 7
    with TorchRuntime(small_model, "fp32", "cuda", cuda_graph=True, max_batch=8) as runtime:
        runner = runtime.open_runner((1, 2, 4, 8), lanes=lanes)
        try:
            # Polled by the loop: no worker thread between it and the device.
            assert isinstance(runner, CudaGraphRunner)
            assert not runner.blocking
            runner.warm_up(1)
            assert set(runner.wall_ms) == {1, 2, 4, 8}
            runner.launch(list(batch), lane_ids)
            while not runner.done():
                pass
            out = runner.collect()
            got: list[np.ndarray] = []
            errors: list[BaseException] = []

            def loop_thread() -> None:
                try:
                    runner.attach()
                    for n in (7, 3, 1):
                        runner.launch(list(batch[:n]), lane_ids[:n])
                        while not runner.done():
                            pass
                        got.append(runner.collect())
                except BaseException as exc:
                    errors.append(exc)

            t = threading.Thread(target=loop_thread)
            t.start()
            t.join(60)
        finally:
            runner.close()
    assert not errors, errors
    np.testing.assert_allclose(out, ref, atol=1e-4)
    assert [len(part) for part in got] == [7, 3, 1]
    for part in got:
        np.testing.assert_allclose(part, ref[:len(part)], atol=1e-4)
