"""Batch runners (an executor's device resources): every window of a batch gets its own
answer, padded buckets included; on CUDA with per-client lanes, one graph per bucket, and
graphs captured while another runner replays (a reload under load).

The CPU tests run everywhere; the CUDA ones on the GPU test machine (`pytest -m gpu`).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stgcnd.backends.base import normalize_buckets
from stgcnd.backends.torch_backend import TorchBackend
from stgcnd.model import reference_logits
from stgcnd.model.synthetic import synthetic_windows

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def batch(small_model):
    spec = small_model.spec
    return synthetic_windows(7, spec.frames, spec.persons, spec.num_node, seed=31)


def test_buckets_always_cover_every_batch_size():
    assert normalize_buckets((1, 2, 4, 8, 16, 32, 64), 16) == (1, 2, 4, 8, 16)
    assert normalize_buckets((4,), 8) == (1, 4)          # 1 is always there
    assert normalize_buckets((64,), 16) == (1, 16)       # clipped to what the backend takes
    assert normalize_buckets((3, 3, 2), 1) == (1,)


def test_cpu_runner_parity_and_estimates(small_model, batch):
    ref = reference_logits(small_model, batch)
    with TorchBackend(small_model, "fp32", "cpu", max_batch=8) as backend:
        runner = backend.open_runner((1, 2, 4, 8), lanes=4)
        try:
            est = runner.warm_up(1)
            assert runner.buckets == tuple(range(1, 9))   # CPU: no padding, every size
            assert est[4] == pytest.approx(4 * est[1])
            out = runner.run(list(batch[:5]), [0, 1, 2, 3, 0])
            assert out.shape == (5, ref.shape[1])
            np.testing.assert_allclose(out, ref[:5], atol=1e-4)
            one = runner.run([batch[6]], [2])
            np.testing.assert_allclose(one[0], ref[6], atol=1e-4)
            with pytest.raises(ValueError):
                runner.run(list(batch[:2]), [0])          # one lane per window
        finally:
            runner.close()


def test_cpu_runner_close_closes_its_session(small_model, batch):
    # The session holds the runtime's threads and buffers; a reload must free them.
    with TorchBackend(small_model, "fp32", "cpu", max_batch=2) as backend:
        runner = backend.open_runner((1, 2), lanes=0)
        runner.run([batch[0]], [0])
        assert not runner.session.closed
        runner.close()
        assert runner.session.closed


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [0, 8])
@pytest.mark.parametrize("precision,tol", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_cuda_runner_parity_padded_buckets_and_lanes(small_model, batch, lanes, precision,
                                                      tol):
    ref = reference_logits(small_model, batch)
    with TorchBackend(small_model, precision, "cuda", cuda_graph=True,
                      max_batch=8) as backend:
        runner = backend.open_runner((1, 2, 4, 8), lanes=lanes)
        try:
            assert sorted(runner.graphs) == [1, 2, 4, 8]      # all captured up front
            est = runner.warm_up(2)
            assert set(est) == {1, 2, 4, 8} and all(v > 0 for v in est.values())
            lane_ids = [0, 3, 3, 7, 1, 2, 5] if lanes else [0] * 7   # lane 3 twice
            full = runner.run(list(batch), lane_ids)           # 7 in bucket 8 (padded)
            three = runner.run(list(batch[:3]), lane_ids[:3])  # 3 in bucket 4
            again = runner.run(list(batch), lane_ids)
        finally:
            runner.close()
    assert np.max(np.abs(full - ref)) <= tol
    assert np.max(np.abs(three - ref[:3])) <= tol
    np.testing.assert_allclose(full, again, rtol=0, atol=tol / 100)
    assert "compute_ms" in runner.last_timings


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("how", ["eager", "torch-replay"])
def test_cuda_runner_fallbacks_give_the_same_answers(small_model, batch, how):
    """The two ways a batch runs through torch itself: no CUDA graphs (each bucket's network
    enqueued eagerly; its output tensor kept until collect, as lanes read it), and graphs
    replayed by torch where torch exposes no graph handle (older torch, e.g. JetPack's)."""
    ref = reference_logits(small_model, batch)
    with TorchBackend(small_model, "fp32", "cuda", cuda_graph=how != "eager",
                      max_batch=8) as backend:
        runner = backend.open_runner((1, 2, 4, 8), lanes=4)
        try:
            if how == "torch-replay":
                assert sorted(runner.graph_execs) == [1, 2, 4, 8]
                runner.graph_execs.clear()   # as where raw_cuda_graph_exec does not exist
            else:
                assert not runner.graphs and not runner.nonblocking
            runner.warm_up(1)
            outs = [runner.run(list(batch[:n]), [i % 4 for i in range(n)]) for n in (7, 3, 1)]
        finally:
            runner.close()
    for out in outs:
        np.testing.assert_allclose(out, ref[:len(out)], atol=1e-4)


def test_capture_mode_is_the_one_this_torch_has():
    """torch 2.1 added capture_error_mode; JetPack 5's torch 2.0 captures globally only, and
    passing the keyword there was a TypeError (CI's Python 3.8 stage runs torch 2.0.1)."""
    from stgcnd.backends import torch_backend

    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    want = "thread_local" if (major, minor) >= (2, 1) else "global"
    assert want == torch_backend.CAPTURE_MODE


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["thread_local", "global"])
def test_capturing_a_new_runner_while_another_replays(small_model, batch, mode, monkeypatch):
    """A reload builds new executors (graph captures) while the old ones serve: this crashed
    the per-camera design ("Cannot prepare for replay during capturing stage"). "global" is
    torch 2.0's only capture mode (JetPack 5), asked of this torch explicitly: the serving
    runner, polled as the I/O loop does, must then keep off the device during captures."""
    from stgcnd.backends import torch_backend

    monkeypatch.setattr(torch_backend, "CAPTURE_MODE", mode)
    ref = reference_logits(small_model, batch)
    with TorchBackend(small_model, "fp16", "cuda", cuda_graph=True, max_batch=8) as backend:
        serving = backend.open_runner((1, 2, 4, 8), lanes=4)
        stop = threading.Event()
        errors: list[BaseException] = []
        worst = [0.0]

        def serve() -> None:
            try:
                turn = 0
                while not stop.is_set():
                    turn += 1
                    if turn % 2:
                        out = serving.run(list(batch[:4]), [0, 1, 2, 3])
                    else:  # as the I/O loop drives it: launch, poll done, collect
                        serving.launch(list(batch[:4]), [0, 1, 2, 3])
                        while not serving.done():
                            pass
                        out = serving.collect()
                    worst[0] = max(worst[0], float(np.max(np.abs(out - ref[:4]))))
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=serve)
        t.start()
        try:
            for _ in range(3):   # three reloads' worth of captures
                fresh = backend.open_runner((1, 2, 4, 8), lanes=4)
                out = fresh.run(list(batch), [0, 1, 2, 3, 0, 1, 2])
                fresh.close()
                assert np.max(np.abs(out - ref)) <= 1e-2
        finally:
            stop.set()
            t.join(60)
            serving.close()
    assert not errors, errors
    assert worst[0] <= 1e-2


@gpu
@pytest.mark.gpu
def test_two_runners_prepared_at_once(small_model, batch):
    """`instances = 2` starts two executors together: one's set-up while the other captured
    failed on the H100 ("operation not permitted when stream is capturing") until runners
    were prepared one at a time."""
    ref = reference_logits(small_model, batch)
    with TorchBackend(small_model, "fp16", "cuda", cuda_graph=True, max_batch=8) as backend:
        outs: list[np.ndarray] = []
        errors: list[BaseException] = []

        def executor() -> None:
            try:
                runner = backend.open_runner((1, 2, 4, 8), lanes=4)
                try:
                    runner.warm_up(1)
                    outs.append(runner.run(list(batch), [0, 1, 2, 3, 0, 1, 2]))
                finally:
                    runner.close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=executor) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert len(outs) == 3
    for out in outs:
        assert np.max(np.abs(out - ref)) <= 1e-2


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [0, 8])
def test_cuda_runner_launch_only_enqueues_and_collects_the_same_answers(small_model, batch,
                                                                       lanes):
    """The loop-driven form: launch returns before the device is done, done() says when,
    collect() gives what run() gives; also when another thread than the maker drives it (the
    I/O loop drives runners made by the start-up or reload thread)."""
    ref = reference_logits(small_model, batch)
    lane_ids = [0, 3, 3, 7, 1, 2, 5] if lanes else [0] * 7
    with TorchBackend(small_model, "fp32", "cuda", cuda_graph=True, max_batch=8) as backend:
        assert backend.nonblocking_runners
        runner = backend.open_runner((1, 2, 4, 8), lanes=lanes)
        try:
            assert runner.nonblocking
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
    for part in got:
        np.testing.assert_allclose(part, ref[:len(part)], atol=1e-4)
