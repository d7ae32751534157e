"""The real daemon in a subprocess: real ZeroMQ sockets, real signals, a real notify socket."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from stgcnd.model.reference import load_for_inference as load_model
from stgcnd.model.reference import reference_logits
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from stgcnd_client import Busy, Client, ServerError, ShuttingDown
from stgcnd_client.wire import decode_reply, encode_request
from tests.conftest import REPO
from tests.server.daemon_harness import FRAMES, Daemon, write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("daemon"), reuse_engines=True).start()
    yield d
    code = d.stop()
    d.close()
    assert code == 0


@pytest.fixture
def new_daemon(tmp_path):
    """Make daemons for one test; each is stopped at teardown, whether the test passed or not."""
    made: list[Daemon] = []

    def make(*args, **kwargs) -> Daemon:
        d = Daemon(*args, reuse_engines=True, **kwargs)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


@pytest.fixture(scope="module")
def reference():
    """The fp32 reference: the PyTorch network where torch is installed, else its numpy twin."""
    return load_model(ModelSpec(frames=FRAMES, labels=("normal", "shoplifting")))


@contextlib.contextmanager
def raw_dealer(endpoint: str):
    """A bare DEALER socket, for hand-built frames the client library would never send."""
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        yield s
    finally:
        s.close()


def raw_request(endpoint: str, frames: list[bytes], timeout_ms: int = 5000) -> dict:
    """Send hand-built frames from a DEALER; return the decoded reply."""
    with raw_dealer(endpoint) as s:
        s.send_multipart(frames)
        assert s.poll(timeout_ms), "no reply"
        rep = decode_reply(s.recv_multipart())
    return {"id": rep.id, "ok": rep.ok, "code": rep.error.code if rep.error else None,
            "message": rep.error.message if rep.error else None, "result": rep.result}


def test_ready_status_and_hello(daemon):
    ready = next(m for m in daemon.notify.messages if "READY" in m)
    assert ready["READY"] == "1" and "serving demo" in ready["STATUS"]
    with Client(daemon.endpoint, camera_id="hello") as c:
        info = c.hello()
    m = info.models[0]
    assert m.name == "demo" and tuple(m.input_shape) == (3, FRAMES, 33, 1)
    assert list(m.labels) == ["normal", "shoplifting"] and m.default


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names from /proc")
def test_threads_carry_their_names_for_top_and_py_spy(daemon):
    from pathlib import Path

    names = {p.read_text().strip() for p in Path(f"/proc/{daemon.proc.pid}/task").glob(
        "*/comm")}
    assert "exec0-demo" in names, names


def test_infer_matches_the_fp32_reference(daemon, reference):
    x = synthetic_windows(3, FRAMES, 1, seed=21)
    ref = reference_logits(reference, x)
    with Client(daemon.endpoint, camera_id="parity") as c:
        for i in range(3):
            r = c.infer(x[i])
            np.testing.assert_allclose(r.logits, ref[i], atol=1e-4)
            assert r.label == int(np.argmax(ref[i]))
            assert r.label_name == ("normal", "shoplifting")[r.label]
            np.testing.assert_allclose(r.probs.sum(), 1.0, atol=1e-6)
            assert {"queue_ms", "compute_ms", "total_ms"} <= set(r.timings)


def test_float16_window_is_accepted(daemon, reference):
    x = synthetic_windows(1, FRAMES, 1, seed=5)
    ref = reference_logits(reference, x.astype(np.float16).astype(np.float32))
    with Client(daemon.endpoint, camera_id="fp16") as c:
        np.testing.assert_allclose(c.infer(x[0].astype(np.float16)).logits, ref[0], atol=1e-3)


def test_push_mode_equals_full_window(daemon):
    clip = synthetic_windows(1, FRAMES + 5, 1, seed=8)[0]
    with Client(daemon.endpoint, camera_id="pusher") as c:
        c.reset()
        results = [c.push(clip[:, i]) for i in range(FRAMES + 5)]
        assert all(r is None for r in results[:FRAMES - 1])
        assert all(r is not None for r in results[FRAMES - 1:])  # stride 1
        for k in (FRAMES - 1, FRAMES + 4):
            window = clip[:, k - FRAMES + 1:k + 1]
            np.testing.assert_allclose(results[k].logits, c.infer(window).logits, atol=1e-5)


def test_sixteen_clients_at_once(daemon, reference):
    x = synthetic_windows(16, FRAMES, 1, seed=3)
    ref = reference_logits(reference, x)
    errors: list[str] = []

    def camera(i: int) -> None:
        try:
            with Client(daemon.endpoint, camera_id=f"cam{i}", timeout=60) as c:
                for _ in range(3):
                    np.testing.assert_allclose(c.infer(x[i]).logits, ref[i], atol=1e-4)
        except Exception as exc:
            errors.append(f"cam{i}: {exc!r}")

    threads = [threading.Thread(target=camera, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors


BAD = [
    (lambda: [b"\xc1not msgpack"], "malformed"),
    (lambda: [b"\x93\x01\x02\x03"], "malformed"),  # a msgpack array, not a map
    (lambda: _hdr(v=2), "unsupported-version"),
    (lambda: _hdr(op="explode"), "unknown-op"),
    (lambda: encode_request("infer", 7, "bad", arrays=[np.zeros((3, FRAMES, 33, 2),
                                                                 np.float32)]), "bad-shape"),
    (lambda: [*_hdr(op="infer", arrays=[{"dtype": "float64", "shape": [3, FRAMES, 33, 1]}]),
              np.zeros((3, FRAMES, 33, 1)).tobytes()], "bad-dtype"),
    (lambda: [encode_request("infer", 7, "bad",
                             arrays=[np.zeros((3, FRAMES, 33, 1), np.float32)])[0], b"\0" * 10],
     "bad-size"),
    (lambda: encode_request("infer", 7, "bad", arrays=[np.full((3, FRAMES, 33, 1), np.nan,
                                                                np.float32)]), "non-finite"),
    (lambda: encode_request("infer", 7, "bad", model="nope",
                            arrays=[np.zeros((3, FRAMES, 33, 1), np.float32)]), "unknown-model"),
    (lambda: encode_request("push", 7, "bad", arrays=[np.zeros((3, 33, 1), np.float32)] * 2),
     "malformed"),
    (lambda: encode_request("infer", 7, "bad", arrays=[np.zeros((3, 1000, 33, 20),
                                                                 np.float32)]), "too-large"),
]


def _hdr(**changes) -> list[bytes]:
    import msgpack

    h = {"v": 1, "op": "ping", "id": 7, "camera": "bad", "model": None, "timeout_ms": None,
         "arrays": []}
    h.update(changes)
    return [msgpack.packb(h)]


@pytest.mark.parametrize("make,code", BAD, ids=[c for _, c in BAD])
def test_bad_input_gets_one_clear_error_and_daemon_lives(daemon, make, code):
    rep = raw_request(daemon.endpoint, make())
    assert not rep["ok"] and rep["code"] == code, rep
    assert rep["message"]
    if code not in ("malformed",):
        assert rep["id"] == 7
    with Client(daemon.endpoint, camera_id="after-bad") as c:
        c.ping()


def test_bad_input_is_logged_rate_limited(daemon):
    for _ in range(20):
        raw_request(daemon.endpoint, _hdr(op="explode", camera="spammer"))
    time.sleep(0.3)
    rejected = [e for e in daemon.log_events() if e.get("event") == "request_rejected"
                and e.get("code") == "unknown-op"]
    assert 1 <= len(rejected) < 10


def test_client_killed_mid_request_changes_nothing(daemon, reference):
    clients = str(REPO / "clients")
    code = (
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {clients!r})\n"
        "from stgcnd_client import Client\n"
        f"c = Client({daemon.endpoint!r}, camera_id='victim')\n"
        "print('go', flush=True)\n"
        f"while True: c.infer(np.random.rand(3, {FRAMES}, 33, 1).astype('float32'))\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"go"
    time.sleep(0.5)
    p.kill()
    p.wait()
    x = synthetic_windows(1, FRAMES, 1, seed=30)
    with Client(daemon.endpoint, camera_id="survivor") as c:
        np.testing.assert_allclose(c.infer(x[0]).logits, reference_logits(reference, x)[0],
                                   atol=1e-4)


def test_full_queue_answers_busy_at_once(daemon):
    w = np.random.default_rng(0).random((3, FRAMES, 33, 1), dtype=np.float32)
    n = 40
    with raw_dealer(daemon.endpoint) as s:
        for i in range(n):
            s.send_multipart(encode_request("infer", i, "flood", arrays=[w]))
        replies = []
        while len(replies) < n and s.poll(30000):
            replies.append(decode_reply(s.recv_multipart()))
    assert len(replies) == n and len({r.id for r in replies}) == n  # exactly one reply each
    codes = [r.error.code if r.error else "ok" for r in replies]
    assert codes.count("busy") > 0 and codes.count("ok") > 0


def test_expired_requests_do_not_run(daemon):
    w = np.random.default_rng(0).random((3, FRAMES, 33, 1), dtype=np.float32)
    with raw_dealer(daemon.endpoint) as s:
        for i in range(6):
            s.send_multipart(encode_request("infer", i, "hurry", arrays=[w], timeout_ms=0.5))
        replies = [decode_reply(s.recv_multipart()) for _ in range(6) if s.poll(30000)]
    assert len(replies) == 6
    assert any(r.error and r.error.code == "expired" for r in replies)


def test_stats_and_latency_log(daemon):
    with Client(daemon.endpoint, camera_id="stats") as c:
        c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
        st = c.stats()
    assert st["requests"] > 0 and "demo" in st["models"]
    time.sleep(1.5)  # stats_interval is 1 s in the test config
    lat = [e for e in daemon.log_events() if e.get("event") == "latency"]
    assert any(e["camera"] == "stats" and e["count"] >= 1 for e in lat)


# -- lifecycle: each test runs its own daemon -----------------------------------------------

def test_sigterm_under_load_drains_and_exits_zero(tmp_path, new_daemon):
    d = new_daemon(tmp_path).start()
    outcomes: list[str] = []
    stop = threading.Event()

    def camera(i: int) -> None:
        w = np.random.default_rng(i).random((3, FRAMES, 33, 1), dtype=np.float32)
        with Client(d.endpoint, camera_id=f"load{i}", timeout=5, retries=0) as c:
            while not stop.is_set():
                try:
                    c.infer(w)
                    outcomes.append("ok")
                except (ShuttingDown, Busy) as exc:
                    outcomes.append(type(exc).__name__)
                except ServerError as exc:
                    outcomes.append(exc.code)
                except Exception as exc:
                    outcomes.append(type(exc).__name__)
                    return

    threads = [threading.Thread(target=camera, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    d.proc.wait(timeout=20)
    took = time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join(20)
    assert d.proc.returncode == 0
    assert took < 12  # drain_timeout 10 s < TimeoutStopSec 15 s
    assert outcomes.count("ok") > 0
    assert d.notify.wait_for("STOPPING", timeout=2)["STOPPING"] == "1"
    events = [e["event"] for e in d.log_events()]
    assert "shutdown_started" in events and "shutdown_complete" in events
    d.close()


def test_sigkill_then_restart_reuses_engine_and_socket(tmp_path, new_daemon):
    d = new_daemon(tmp_path).start()
    d.proc.kill()
    d.proc.wait()
    assert (tmp_path / "d.sock").exists()  # the stale socket a killed daemon leaves
    d2 = new_daemon(tmp_path, config_path=d.config_path).start()
    with Client(d2.endpoint, camera_id="again") as c:
        c.ping()
    assert d2.stop() == 0
    assert not (tmp_path / "d.sock").exists()
    d.close()
    d2.close()


def test_sighup_reload_keeps_cameras(tmp_path, new_daemon):
    d = new_daemon(tmp_path).start()
    with Client(d.endpoint, camera_id="steady") as c:
        c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
        write_config(d.config_path, d.endpoint, d.engines,
                     models=f'[[models]]\nname = "demo"\ndemo = true\nframes = {FRAMES}\n'
                            'backend = "onnxruntime"\n'
                            'labels = ["calm", "theft"]\n')
        d.signal(signal.SIGHUP)
        msg = d.notify.wait_for("RELOADING", timeout=10)
        assert "MONOTONIC_USEC" in msg
        d.notify.wait_for("READY", timeout=120)
        assert list(c.hello().models[0].labels) == ["calm", "theft"]
        r = c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))  # same client, same socket
        assert r.label_name in ("calm", "theft")
        # Only labels changed: a policy key, so the runners stayed (no second model_ready).
        assert [e["event"] for e in d.log_events()].count("model_ready") == 1
        write_config(d.config_path, d.endpoint, d.engines,
                     models=f'[[models]]\nname = "demo"\ndemo = true\nframes = {FRAMES}\n'
                            'backend = "onnxruntime"\nthreads = 1\n')
        d.signal(signal.SIGHUP)
        d.notify.wait_for("RELOADING", timeout=10)
        d.notify.wait_for("READY", timeout=120)
        c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
        # threads is an engine key: new runners, the old ones closed once drained.
        deadline = time.monotonic() + 30
        while "model_closed" not in (events := [e["event"] for e in d.log_events()]):
            assert time.monotonic() < deadline, "the replaced model was never closed"
            time.sleep(0.05)
        assert events.count("model_ready") == 2
    assert d.stop() == 0
    d.close()


def test_watchdog_goes_silent_while_a_worker_is_stuck(tmp_path, new_daemon):
    # One batch that stays on its (noop) device for 1 s, however fast or busy the machine: a
    # call "stuck" for 20 times stall_timeout. (A torch model big enough to take a second on a
    # fast CPU took minutes, with its start-up build, on a busy 2-core one.) Pings: every 50 ms.
    stuck_s = 1.0
    d = new_daemon(tmp_path, env={"WATCHDOG_USEC": "100000"},
                   models=f'[[models]]\nname = "big"\ndemo = true\nframes = {FRAMES}\n'
                          f'backend = "noop"\nmax_batch = 1\n'
                          f'noop_compute_us = {int(stuck_s * 1e6)}\n',
                   stall_timeout=0.05)
    d.config_path.write_text(d.config_path.read_text().replace("warmup_runs = 1",
                                                               "warmup_runs = 0"))
    d.start()
    d.notify.wait_for("WATCHDOG", timeout=10)  # pinging while healthy
    done = threading.Event()

    def slow() -> None:
        with Client(d.endpoint, camera_id="slow", timeout=120, retries=0) as c:
            c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
        done.set()

    t0 = time.monotonic()
    t = threading.Thread(target=slow)
    t.start()
    deadline = time.monotonic() + stuck_s
    while not any(e.get("event") == "watchdog_stall" for e in d.log_events()):
        assert time.monotonic() < deadline, "no watchdog_stall while the batch was stuck"
        time.sleep(0.02)
    d.notify.read(0.02)  # pings sent before the stall was noticed
    silent = d.notify.read(0.15)  # three ping intervals
    assert not done.is_set() and time.monotonic() - t0 < stuck_s, \
        "the inference ended too soon to observe a stall"
    assert not any("WATCHDOG" in m for m in silent), silent
    t.join(180)
    assert done.is_set()
    d.notify.skip_seen()
    d.notify.wait_for("WATCHDOG", timeout=10)  # pinging again
    assert d.stop() == 0
    d.close()


def test_logs_summarize_counts_a_daemon_run(tmp_path, new_daemon):
    """Issue 6: the daemon's own log, read back by `stgcnd logs summarize`, gives the counts."""
    import json

    d = new_daemon(tmp_path).start()
    ok, bad = 5, 2
    with Client(d.endpoint, camera_id="cam3") as c:
        for i in range(ok):
            c.infer(synthetic_windows(1, FRAMES, 1, seed=i)[0])
    for _ in range(bad):
        rep = raw_request(d.endpoint, encode_request(
            "infer", 1, "cam3", arrays=[np.zeros((3, FRAMES, 33, 2), np.float32)]))
        assert rep["code"] == "bad-shape"
    assert d.stop() == 0  # the last latency interval is flushed at shutdown
    lines = d.log_path.read_text().splitlines()
    assert lines and all(line.startswith("{") for line in lines), [
        line for line in lines if not line.startswith("{")][:3]  # JSON lines only
    r = subprocess.run([sys.executable, "-m", "stgcnd", "logs", "summarize", str(d.log_path),
                        "--camera", "cam3", "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    (stream,) = summary["streams"]
    assert (stream["camera"], stream["model"]) == ("cam3", "demo")
    assert stream["requests"] == ok + bad and stream["ok"] == ok and stream["errors"] == bad
    assert stream["busy"] == 0 and stream["expired"] == 0
    assert stream["latency"]["max_ms"] > 0
    d.close()


def test_idle_cameras_are_reclaimed_and_come_back(tmp_path, new_daemon):
    d = new_daemon(tmp_path, idle_timeout=0.5, max_cameras=2).start()
    w = np.zeros((3, FRAMES, 33, 1), np.float32)
    with Client(d.endpoint, camera_id="sleepy") as c:
        first = c.infer(w)
        st = c.stats()
        assert "sleepy" in st["cameras"]
        lane = st["cameras"]["sleepy"]["lane"]
        deadline = time.monotonic() + 10
        while "sleepy" in c.stats()["cameras"] and time.monotonic() < deadline:
            time.sleep(0.2)  # reclaimed at the next stats tick after 0.5 s idle
        assert "sleepy" not in c.stats()["cameras"]
        # Its lane is free again: two new cameras fit under max_cameras=2.
        for cam in ("x", "y"):
            with Client(d.endpoint, camera_id=cam) as other:
                other.infer(w)
        assert lane in {v["lane"] for v in c.stats()["cameras"].values()}
    assert any(e.get("event") == "camera_reclaimed" and e.get("camera") == "sleepy"
               for e in d.log_events())
    time.sleep(1.5)
    with Client(d.endpoint, camera_id="sleepy") as c:  # and it comes back
        np.testing.assert_allclose(c.infer(w).logits, first.logits, atol=1e-6)
    assert d.stop() == 0
    d.close()


def test_unloadable_model_fails_startup_clearly(tmp_path, new_daemon):
    d = new_daemon(tmp_path, models=f'[[models]]\nname = "x"\nframes = {FRAMES}\n'
                                f'checkpoint = "{tmp_path / "missing.pt"}"\n'
                                'backend = "onnxruntime"\n')
    d.start(wait_ready=False)
    assert d.proc.wait(timeout=120) == 2
    text = d.log_path.read_text()
    assert "model 'x'" in text and "checkpoint not found" in text
    assert "Traceback" not in text
    assert not any("READY" in m for m in d.notify.read(0.2))
    d.close()


def test_bad_config_on_reload_keeps_serving(tmp_path, new_daemon):
    d = new_daemon(tmp_path).start()
    with Client(d.endpoint, camera_id="steady") as c:
        before = c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
        d.config_path.write_text("[server\nbroken")
        d.signal(signal.SIGHUP)
        d.notify.wait_for("RELOADING", timeout=10)
        assert "reload failed" in d.notify.wait_for("READY", timeout=60)["STATUS"]
        after = c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
        np.testing.assert_allclose(after.logits, before.logits, atol=1e-6)
    failed = [e for e in d.log_events() if e.get("event") == "reload"
              and e.get("phase") == "failed"]
    assert failed and "invalid TOML" in failed[0]["error"]
    assert d.stop() == 0
    d.close()


def test_camera_count_is_bounded(tmp_path, new_daemon):
    d = new_daemon(tmp_path, max_cameras=2).start()
    w = np.zeros((3, FRAMES, 33, 1), np.float32)
    for cam in ("a", "b"):
        with Client(d.endpoint, camera_id=cam) as c:
            c.infer(w)
    with Client(d.endpoint, camera_id="c", retries=0) as c:
        with pytest.raises(Busy, match="max_cameras=2"):
            c.infer(w)
        c.ping()  # still served: only new cameras are refused
        assert set(c.stats()["cameras"]) == {"a", "b"}
    with Client(d.endpoint, camera_id="a") as c:
        c.infer(w)  # known cameras keep working
    assert d.stop() == 0
    d.close()


def test_debug_level_logs_each_request_for_exact_percentiles(tmp_path, new_daemon):
    import json

    d = new_daemon(tmp_path)
    d.start_args = ["--log-level", "debug"]
    d.start()
    with Client(d.endpoint, camera_id="cam7") as c:
        totals = [c.infer(synthetic_windows(1, FRAMES, 1, seed=i)[0]).timings["total_ms"]
                  for i in range(6)]
    assert d.stop() == 0
    reqs = [e for e in d.log_events() if e.get("event") == "request" and e["camera"] == "cam7"]
    assert len(reqs) == 6 and all(e["outcome"] == "ok" for e in reqs)
    assert {"queue_ms", "compute_ms", "request_id"} <= set(reqs[0])
    # The logged total also covers encoding the reply, so it is a little larger.
    logged = sorted(e["total_ms"] for e in reqs)
    assert all(0 <= got - want < 1.0 for got, want in zip(logged, sorted(totals)))
    r = subprocess.run([sys.executable, "-m", "stgcnd", "logs", "summarize", str(d.log_path),
                        "--camera", "cam7", "--json"], capture_output=True, text=True,
                       timeout=120)
    (stream,) = json.loads(r.stdout)["streams"]
    assert stream["latency"]["method"].startswith("exact")
    assert stream["latency"]["max_ms"] == pytest.approx(logged[-1], abs=1e-3)
    d.close()


def test_skeleton_window_push_and_window_agree_through_the_daemon(daemon):
    """The camera-side helper end to end: per-person landmarks -> frames pushed one by one
    give the same prediction as the window the helper assembles, sent whole."""
    from stgcnd_client import SkeletonWindow

    people_per_frame = synthetic_windows(1, FRAMES + 3, 1, seed=12)[0]  # (3, T, V, 1)
    win = SkeletonWindow(frames=FRAMES, persons=1)
    with Client(daemon.endpoint, camera_id="mediapipe-cam") as c:
        c.reset()
        last = None
        for t in range(FRAMES + 3):
            landmarks = people_per_frame[:, t, :, 0].T  # one person: (33, 3) x, y, visibility
            last = c.push(win.frame([landmarks]))
        assert win.ready and last is not None
        np.testing.assert_allclose(c.infer(win.window()).logits, last.logits, atol=1e-5)
