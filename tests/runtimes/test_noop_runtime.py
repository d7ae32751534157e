"""The noop runtime: the real Runtime/Runner contract, zero logits, a simulated device time,
no torch; and the daemon serving it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from stgcnd.engines.options import BuildOptions
from stgcnd.errors import UserError
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.provision import open_runtime
from stgcnd.runtimes import NAMES, available
from stgcnd.runtimes.noop import NoopRunner, NoopRuntime, noop_num_class
from stgcnd.server.config import load_config
from tests.conftest import write_checkpoint
from tests.runtimes.conftest import opened
from tests.runtimes.test_torch_free import run as run_without_torch
from tests.server.daemon_harness import Daemon, write_config


def test_zero_logits_of_the_right_shape_and_timings():
    spec = ModelSpec(frames=24, persons=2, labels=("a", "b", "c"))
    runtime = open_runtime(spec, "noop", BuildOptions(max_batch=4), store=object())
    assert runtime.info.name == "noop" and runtime.info.device == "cpu"
    assert runtime.info.input_shape == (3, 24, 33, 2) and runtime.info.num_class == 3
    assert runtime.info.max_batch == 4
    x = synthetic_windows(4, 24, 2, seed=1)
    with opened(runtime, (1, 2, 4), lanes=4) as runner:
        for n in (1, 3, 4):
            out = runner.run(list(x[:n]))
            assert out.shape == (n, 3) and out.dtype == np.float32
            assert not out.any()
            assert set(runner.last_timings) == {"compute_ms", "total_ms"}
            assert 0 <= runner.last_timings["compute_ms"] <= runner.last_timings["total_ms"]
        out[:] = 7.0  # a caller scribbling on its result must not change the next one
        assert not runner.run(list(x[:4])).any()
        assert not runner.run(list(x[:2].astype(np.float16))).any()


def test_batch_runner_for_the_daemons_executors():
    """Zero rows per window, every bucket warmed. Like a GPU runner it is non-blocking (the
    I/O loop polls it, no worker thread) and keeps the configured buckets (padding)."""
    runtime = NoopRuntime((3, 8, 33, 1), num_class=3, max_batch=8)
    with opened(runtime, (1, 2, 4, 8), lanes=16) as runner:
        assert isinstance(runner, NoopRunner)
        assert not runner.blocking
        estimates = runner.warm_up(runs=2)
        assert sorted(estimates) == [1, 2, 4, 8] and all(v >= 0 for v in estimates.values())
        assert sorted(runner.wall_ms) == [1, 2, 4, 8]
        x = synthetic_windows(3, 8, 1, seed=9)
        out = runner.run(list(x), lanes=[5, 0, 15])
        assert out.shape == (3, 3) and out.dtype == np.float32 and not out.any()
        assert {"compute_ms", "total_ms"} <= set(runner.last_timings)
        assert runner.bucket_for(3) == 4 and runner.bucket_for(8) == 8
        with pytest.raises(ValueError, match="exceeds"):
            runner.bucket_for(9)


def test_simulated_compute_time_finishes_each_batch_that_long_after_its_launch():
    """compute_us: launch returns at once; done() turns true only after that time; run()
    (launch, wait, collect) waits it out."""
    # 200 ms: a launch that waited it out shows, and a busy machine's stalls (tens of ms) do not
    runtime = NoopRuntime((3, 8, 33, 1), num_class=2, max_batch=4, compute_us=200_000)
    with opened(runtime, (1, 4), lanes=4) as runner:
        x = list(synthetic_windows(2, 8, 1, seed=3))
        t0 = time.perf_counter()
        runner.launch(x, [0, 1])
        launched = time.perf_counter() - t0
        assert launched < 0.1, f"launch took {launched * 1e3:.1f} ms; it must not wait"
        assert not runner.done()
        while not runner.done():
            time.sleep(0.001)
        assert time.perf_counter() - t0 >= 0.2
        out = runner.collect()
        assert out.shape == (2, 2) and runner.last_timings["compute_ms"] >= 200.0
        t0 = time.perf_counter()
        runner.run(x[:1], [2])
        assert time.perf_counter() - t0 >= 0.2


def test_the_runner_copies_the_input_into_its_own_buffer():
    runtime = NoopRuntime((3, 8, 33, 1), num_class=2, max_batch=2)
    x = synthetic_windows(2, 8, 1, seed=2)
    with opened(runtime, (2,)) as runner:
        runner.run(list(x))
        np.testing.assert_array_equal(runner._staging, x)  # the copy really happened
        x[:] = 0.0
        assert runner._staging.any(), "the runner kept a view of the caller's array, not a copy"
    with opened(runtime, (2,)) as a, opened(runtime, (2,)) as b:
        assert not np.shares_memory(a._staging, b._staging)


def test_bad_batches_are_refused():
    runtime = NoopRuntime((3, 8, 33, 1), num_class=2, max_batch=2)
    with opened(runtime, (1, 2), lanes=2) as runner:
        with pytest.raises(ValueError, match=r"1\.\.2 windows"):
            runner.run([np.zeros((3, 8, 33, 1), np.float32)] * 3)
        with pytest.raises(ValueError, match="one lane each"):
            runner.launch([np.zeros((3, 8, 33, 1), np.float32)], [0, 1])
        with pytest.raises(ValueError):  # a window of another shape cannot be staged
            runner.run([np.zeros((3, 9, 33, 1), np.float32)])
    with pytest.raises(ValueError, match="num_class"):
        NoopRuntime((3, 8, 33, 1), num_class=0)
    with pytest.raises(ValueError, match="max_batch"):
        NoopRuntime((3, 8, 33, 1), num_class=2, max_batch=0)


def test_num_class_comes_from_labels_then_checkpoint_then_spec(tmp_path):
    pytest.importorskip("torch")  # writes a PyTorch checkpoint
    from stgcnd.model.demo import demo_state_dict

    ckpt = write_checkpoint(tmp_path / "five.pt",
                            demo_state_dict("mediapipe", "spatial", num_class=5, seed=3))
    assert noop_num_class(ModelSpec(checkpoint=ckpt)) == (5, "checkpoint")
    assert noop_num_class(ModelSpec(checkpoint=ckpt, labels=("x",) * 5)) == (5, "labels")
    assert noop_num_class(ModelSpec()) == (2, "spec")
    assert noop_num_class(ModelSpec(labels=("a", "b", "c", "d"))) == (4, "labels")
    runtime = NoopRuntime.from_spec(ModelSpec(checkpoint=ckpt), max_batch=2)
    assert runtime.info.num_class == 5
    assert runtime.info.details == {"num_class_from": "checkpoint"}


def test_registered_and_accepted_by_the_daemon_config(tmp_path):
    assert "noop" in NAMES and available()["noop"] is None
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
        from stgcnd.provision import open_runtime
        from stgcnd.engines.options import BuildOptions
        from stgcnd.model.spec import ModelSpec
        import numpy as np
        rt = open_runtime(ModelSpec(frames=10), "noop", BuildOptions(), store=object())
        runner = rt.open_runner((1,), 0)
        out = runner.run([np.ones((3, 10, 33, 1), np.float32)])
        runner.close()
        print(json.dumps({"out": out.tolist(),
                          "torch_loaded": sys.modules.get("torch") is not None}))
    """)
    assert res == {"out": [[0.0, 0.0]], "torch_loaded": False}


@pytest.mark.slow
def test_daemon_serves_zero_logits_with_the_noop_runtime(tmp_path):
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
