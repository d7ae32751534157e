"""The I/O loop through a real daemon subprocess: it launches batches and finishes them on its
timer. A noop model whose batches take 20 ms (`noop_compute_us`)
stands in for a GPU, so batches form while one is on the "device" and the loop has to come
back for it, as on a GPU; no torch needed."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import numpy as np
import pytest
import zmq

from stgcnd import cpupower
from stgcnd.model.synthetic import synthetic_windows
from stgcnd_client import Client
from stgcnd_client.wire import decode_reply, encode_request
from tests.server.daemon_harness import REPO, Daemon, write_config
from tests.server.test_daemon import raw_dealer

FRAMES = 20


def _models(compute_us: int, extra: str = "") -> str:
    return (f'[[models]]\nname = "dev"\nbackend = "noop"\ndemo = true\nframes = {FRAMES}\n'
            f'max_batch = 8\nbuckets = [1, 2, 4, 8]\nnoop_compute_us = {compute_us}\n{extra}')


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("loop"), queue_size=8, models=_models(20_000)).start()
    yield d
    code = d.stop()
    d.close()
    assert code == 0


def _window(seed: int) -> np.ndarray:
    return synthetic_windows(1, FRAMES, 1, seed=seed)[0]


def test_every_request_gets_exactly_one_reply_out_of_shared_batches(daemon):
    """Eight cameras each send a burst of 6 without waiting: while one batch is on the device
    the others queue, so later batches hold several cameras; every request is answered once."""
    _burst_is_answered_once(daemon.endpoint)


def _burst_is_answered_once(endpoint: str) -> None:
    cameras, per_camera = 8, 6
    sockets = []
    with_ids: Counter = Counter()
    replies = []
    try:
        for _ in range(cameras):
            s = zmq.Context.instance().socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(endpoint)
            sockets.append(s)
        for i in range(per_camera):
            for c, s in enumerate(sockets):
                s.send_multipart(encode_request("infer", 1000 * c + i, f"burst{c}", None,
                                                [_window(c)]))
        end = time.monotonic() + 30
        poller = zmq.Poller()
        for s in sockets:
            poller.register(s, zmq.POLLIN)
        while len(replies) < cameras * per_camera and time.monotonic() < end:
            for s, _ in poller.poll(500):
                reply = decode_reply(s.recv_multipart())
                with_ids[reply.id] += 1
                replies.append(reply)
        for s, _ in poller.poll(300):  # nothing more may come
            with_ids[decode_reply(s.recv_multipart()).id] += 1
    finally:
        for s in sockets:
            s.close()
    want = {1000 * c + i for c in range(cameras) for i in range(per_camera)}
    assert set(with_ids) == want and set(with_ids.values()) == {1}, with_ids
    assert all(r.ok for r in replies), [r.error for r in replies if not r.ok]
    batches = [r.result["timings"]["batch"] for r in replies]
    assert max(batches) > 1, f"no request shared a batch: {batches}"
    assert min(r.result["timings"]["compute_ms"] for r in replies) >= 20.0


def test_the_loop_looks_for_batches_with_a_timerfd(daemon):
    ready = [e for e in daemon.log_events() if e.get("event") == "ready"]
    assert ready and ready[0]["loop_timer"] == "timerfd"
    # The same machine's idle and clock settings, as this process reads them.
    assert ready[0]["cpu_power"] == cpupower.summary(cpupower.cpu_power())


def test_without_a_timerfd_the_loop_looks_in_whole_milliseconds_and_serves(tmp_path):
    """Where timerfd_create is missing (not Linux), the loop comes back for a batch through
    poll timeouts instead. A real daemon whose timer module finds no libc (a sitecustomize
    on its PYTHONPATH, read by Python at start-up) serves the same burst exactly once."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import stgcnd.server.wakeup as timer\n"
        "timer._libc = lambda: None  # as on a system without timerfd\n")
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH")) if p)
    d = Daemon(tmp_path, queue_size=8, models=_models(20_000),
               env={"PYTHONPATH": path}).start()
    try:
        ready = [e for e in d.log_events() if e.get("event") == "ready"]
        assert ready and ready[0]["loop_timer"] == "poll-ms"
        _burst_is_answered_once(d.endpoint)
    finally:
        code = d.stop()
        d.close()
    assert code == 0


def test_a_deadline_shorter_than_a_batch_is_expired(daemon):
    """A 5 ms deadline cannot hold a 20 ms batch: `expired` at once, judged by the warmed
    estimate; a generous one is served."""
    with raw_dealer(daemon.endpoint) as s:
        s.send_multipart(encode_request("infer", 1, "hurry", arrays=[_window(1)],
                                        timeout_ms=5))
        s.send_multipart(encode_request("infer", 2, "hurry", arrays=[_window(2)],
                                        timeout_ms=5000))
        got = {}
        while len(got) < 2 and s.poll(10000):
            rep = decode_reply(s.recv_multipart())
            got[rep.id] = rep
    assert got[1].error is not None and got[1].error.code == "expired", got[1]
    assert got[2].ok, got[2].error


def test_sigterm_with_batches_on_the_device_answers_them_and_exits_0(tmp_path):
    # No warm-up: its 4 batches would take 0.4 s each before READY (the device time is there
    # for the batches in flight at SIGTERM).
    d = Daemon(tmp_path, models=_models(400_000), warmup_runs=0).start()
    try:
        with raw_dealer(d.endpoint) as s:
            for i in range(3):
                s.send_multipart(encode_request("infer", i, f"cam{i}", None, [_window(i)]))
            time.sleep(0.1)  # the first batch is on the "device", the others queued
            d.signal(signal.SIGTERM)
            got = []
            while len(got) < 3 and s.poll(5000):
                got.append(decode_reply(s.recv_multipart()))
        assert sorted(r.id for r in got) == [0, 1, 2]
        assert all(r.ok for r in got), [r.error for r in got]
        assert d.proc is not None and d.proc.wait(30) == 0
    finally:
        d.close()


def test_a_removed_key_says_what_to_do(tmp_path, stgcnd_main):
    config = write_config(tmp_path / "stgcnd.toml", f"ipc://{tmp_path / 'd.sock'}",
                          tmp_path / "engines", models=(
                              f'[[models]]\nname = "cpu"\nbackend = "noop"\n'
                              f'demo = true\nframes = {FRAMES}\ndispatch = "loop"\n'))
    out = stgcnd_main("serve", "--config", str(config), cwd=REPO)
    assert out.returncode == 2
    text = out.stdout + out.stderr
    assert "dispatch was removed" in text and "delete the line" in text, text[-2000:]


def test_noop_compute_us_belongs_to_the_noop_backend(tmp_path, stgcnd_main):
    config = write_config(tmp_path / "stgcnd.toml", f"ipc://{tmp_path / 'd.sock'}",
                          tmp_path / "engines", models=(
                              f'[[models]]\nname = "m"\nbackend = "torch"\ndemo = true\n'
                              f'frames = {FRAMES}\nnoop_compute_us = 100\n'))
    out = stgcnd_main("serve", "--config", str(config), cwd=REPO)
    assert out.returncode == 2 and "noop_compute_us" in out.stdout + out.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("instances", [1, 2])
def test_on_a_gpu_torch_is_loop_driven_and_each_camera_gets_its_own_answer(tmp_path,
                                                                           instances):
    """torch with CUDA graphs: eight cameras at once get the fp32 reference's answers for
    their own windows out of shared batches; with two executors the loop keeps two batches on
    the GPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import threading

    from stgcnd.model.reference import load_for_inference as load_model
    from stgcnd.model.reference import reference_logits
    from stgcnd.model.spec import ModelSpec

    frames = 30
    d = Daemon(tmp_path, queue_size=8, models=(
        f'[[models]]\nname = "gpu"\nbackend = "torch"\ndevice = "cuda"\nprecision = "fp32"\n'
        f'demo = true\nframes = {frames}\nmax_batch = 8\nbuckets = [1, 2, 4, 8]\n'
        f'instances = {instances}\nlabels = ["normal", "shoplifting"]\n')).start()
    results: dict[tuple[int, int], object] = {}
    errors: list[BaseException] = []

    def camera(c: int) -> None:
        try:
            with Client(d.endpoint, camera_id=f"gpu{c}", timeout=60) as client:
                for i in range(6):
                    results[(c, i)] = client.infer(
                        synthetic_windows(1, frames, 1, seed=100 * c + i)[0])
        except BaseException as exc:
            errors.append(exc)

    try:
        with Client(d.endpoint, camera_id="stats", timeout=10) as c:
            stats = c.stats()["models"]["gpu"]
            assert len(stats["executors"]) == instances
        threads = [threading.Thread(target=camera, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        code = d.stop()
        d.close()
    assert code == 0 and not errors, errors
    reference = load_model(ModelSpec(frames=frames, labels=("normal", "shoplifting")))
    keys = sorted(results)
    want = reference_logits(reference, np.stack(
        [synthetic_windows(1, frames, 1, seed=100 * c + i)[0] for c, i in keys]))
    got = np.stack([results[k].logits for k in keys])
    np.testing.assert_allclose(got, want, atol=1e-4)
