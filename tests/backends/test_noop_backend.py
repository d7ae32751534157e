"""The noop backend: the real Backend/Session contract, zero logits, no torch."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from stgcnd.backends import registry
from stgcnd.backends.noop_backend import NoopBackend, noop_num_class
from stgcnd.engines.options import BuildOptions
from stgcnd.errors import UserError
from stgcnd.model import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.server.config import load_config
from tests.backends.test_torch_free import run as run_without_torch
from tests.conftest import write_checkpoint
from tests.server.daemon_harness import Daemon, write_config


def test_zero_logits_of_the_right_shape_and_timings():
    spec = ModelSpec(frames=24, persons=2, labels=("a", "b", "c"))
    backend = registry.open_backend(spec, "noop", BuildOptions(max_batch=4), store=object())
    assert backend.info.name == "noop" and backend.info.device == "cpu"
    assert backend.info.input_shape == (3, 24, 33, 2) and backend.info.num_class == 3
    x = synthetic_windows(4, 24, 2, seed=1)
    with backend.open_session() as s:
        for n in (1, 3, 4):
            out = s.infer(x[:n])
            assert out.shape == (n, 3) and out.dtype == np.float32
            assert not out.any()
            assert set(s.last_timings) == {"compute_ms", "total_ms"}
            assert 0 <= s.last_timings["compute_ms"] <= s.last_timings["total_ms"]
        out[:] = 7.0  # a caller scribbling on its result must not change the next one
        assert not s.infer(x[:4]).any()
        s.infer(x[:2].astype(np.float16))


def test_batch_runner_for_the_daemons_executors():
    """The executors' form (backend.open_runner): zero rows per window, every bucket warmed.
    Like a GPU runner it is non-blocking and keeps the configured buckets."""
    backend = NoopBackend((3, 8, 33, 1), num_class=3, max_batch=8)
    assert backend.nonblocking_runners
    runner = backend.open_runner(buckets=(1, 2, 4, 8), lanes=16)
    try:
        assert runner.nonblocking
        estimates = runner.warm_up(runs=2)
        assert sorted(estimates) == [1, 2, 4, 8] and all(v >= 0 for v in estimates.values())
        assert sorted(runner.wall_ms) == [1, 2, 4, 8]
        x = synthetic_windows(3, 8, 1, seed=9)
        out = runner.run(list(x), lanes=[5, 0, 15])
        assert out.shape == (3, 3) and out.dtype == np.float32 and not out.any()
        assert {"compute_ms", "total_ms"} <= set(runner.last_timings)
        assert runner.bucket_for(3) == 4
    finally:
        runner.close()


def test_simulated_compute_time_finishes_each_batch_that_long_after_its_launch():
    """compute_us: launch returns at once; done() turns true only after that time; run()
    (the threaded executors' form) waits it out."""
    backend = NoopBackend((3, 8, 33, 1), num_class=2, max_batch=4)
    backend.compute_us = 30_000
    runner = backend.open_runner(buckets=(1, 4), lanes=4)
    try:
        x = list(synthetic_windows(2, 8, 1, seed=3))
        t0 = time.perf_counter()
        runner.launch(x, [0, 1])
        launched = time.perf_counter() - t0
        assert launched < 0.02, f"launch took {launched * 1e3:.1f} ms; it must not wait"
        assert not runner.done()
        while not runner.done():
            time.sleep(0.001)
        assert time.perf_counter() - t0 >= 0.03
        out = runner.collect()
        assert out.shape == (2, 2) and runner.last_timings["compute_ms"] >= 30.0
        t0 = time.perf_counter()
        runner.run(x[:1], [2])
        assert time.perf_counter() - t0 >= 0.03
    finally:
        runner.close()


def test_session_copies_the_input_into_its_own_buffer():
    backend = NoopBackend((3, 8, 33, 1), num_class=2, max_batch=2)
    x = synthetic_windows(2, 8, 1, seed=2)
    with backend.open_session() as s:
        s.infer(x)
        np.testing.assert_array_equal(s._staging, x)  # the copy really happened
        x[:] = 0.0
        assert s._staging.any(), "the session kept a view of the caller's array, not a copy"
    with backend.open_session() as a, backend.open_session() as b:
        assert not np.shares_memory(a._staging, b._staging)


def test_bad_batches_get_the_contracts_errors():
    backend = NoopBackend((3, 8, 33, 1), num_class=2, max_batch=2)
    with backend.open_session() as s:
        with pytest.raises(UserError, match="shape"):
            s.infer(np.zeros((1, 3, 9, 33, 1), np.float32))
        with pytest.raises(UserError, match="batch size 3"):
            s.infer(np.zeros((3, 3, 8, 33, 1), np.float32))
        with pytest.raises(UserError, match="float32 or float16"):
            s.infer(np.zeros((1, 3, 8, 33, 1), np.int32))
    with pytest.raises(RuntimeError, match="closed"):
        s.infer(np.zeros((1, 3, 8, 33, 1), np.float32))


def test_one_thread_at_a_time_per_session():
    """The base contract's guard holds for the noop too (its infer is fast, so make it slow)."""
    backend = NoopBackend((3, 8, 33, 1), num_class=2)
    entered, release = threading.Event(), threading.Event()
    with backend.open_session() as s:
        real = s._infer

        def slow(batch):
            entered.set()
            release.wait(10)
            return real(batch)

        s._infer = slow  # type: ignore[method-assign]
        x = np.zeros((1, 3, 8, 33, 1), np.float32)
        t = threading.Thread(target=s.infer, args=(x,))
        t.start()
        assert entered.wait(10)
        with pytest.raises(RuntimeError, match="one thread at a time"):
            s.infer(x)
        release.set()
        t.join(10)


def test_num_class_comes_from_labels_then_checkpoint_then_spec(tmp_path):
    pytest.importorskip("torch")  # writes a PyTorch checkpoint
    from stgcnd.model.demo import demo_state_dict

    ckpt = write_checkpoint(tmp_path / "five.pt",
                            demo_state_dict("mediapipe", "spatial", num_class=5, seed=3))
    assert noop_num_class(ModelSpec(checkpoint=ckpt)) == (5, "checkpoint")
    assert noop_num_class(ModelSpec(checkpoint=ckpt, labels=("x",) * 5)) == (5, "labels")
    assert noop_num_class(ModelSpec()) == (2, "spec")
    assert noop_num_class(ModelSpec(labels=("a", "b", "c", "d"))) == (4, "labels")


def test_registered_and_accepted_by_the_daemon_config(tmp_path):
    assert "noop" in registry.BACKENDS and registry.available_backends()["noop"] is None
    cfg = write_config(tmp_path / "c.toml", "ipc:///tmp/x", tmp_path,
                       models='[[models]]\nname = "m"\nbackend = "noop"\ndemo = true\n')
    assert load_config(cfg, env={}).models[0].backend == "noop"
    bad = write_config(tmp_path / "b.toml", "ipc:///tmp/x", tmp_path,
                       models='[[models]]\nname = "m"\nbackend = "nop"\ndemo = true\n')
    with pytest.raises(UserError, match="noop"):
        load_config(bad, env={})


def test_noop_opens_and_runs_without_torch():
    res = run_without_torch("""
        import json
        from stgcnd.backends.registry import open_backend
        from stgcnd.engines.options import BuildOptions
        from stgcnd.model.spec import ModelSpec
        import numpy as np
        b = open_backend(ModelSpec(frames=10), "noop", BuildOptions(), store=object())
        with b.open_session() as s:
            out = s.infer(np.ones((1, 3, 10, 33, 1), np.float32))
        print(json.dumps({"out": out.tolist(),
                          "torch_loaded": sys.modules.get("torch") is not None}))
    """)
    assert res == {"out": [[0.0, 0.0]], "torch_loaded": False}


@pytest.mark.slow
def test_daemon_serves_zero_logits_with_the_noop_backend(tmp_path):
    from stgcnd_client import Client

    models = ('[[models]]\nname = "fast"\nframes = 20\npersons = 2\nbackend = "noop"\n'
              'demo = true\nlabels = ["normal", "theft", "fall"]\n')
    d = Daemon(tmp_path, models=models)
    try:
        d.start()
        x = synthetic_windows(1, 20, 2, seed=4)[0]
        with Client(d.endpoint, camera_id="noop-cam", timeout=10) as c:
            info = c.hello().model("fast")
            assert info.backend == "noop" and tuple(info.input_shape) == (3, 20, 33, 2)
            r = c.infer(x)
            pushed = [c.push(x[:, i]) for i in range(20)]
        assert r.logits.tolist() == [0.0, 0.0, 0.0]
        np.testing.assert_allclose(r.probs, [1 / 3] * 3, rtol=1e-6)
        assert {"queue_ms", "compute_ms", "total_ms"} <= set(r.timings)
        assert pushed[-1] is not None and not pushed[-1].logits.any()
        assert d.stop() == 0
    finally:
        d.close()
