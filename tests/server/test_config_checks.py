"""server/config_checks.py: what `config check`, `serve` and a reload refuse before loading a
model, said with the configuration key that fixes it, all problems at once (issue #32)."""

from __future__ import annotations

import signal

import numpy as np
import pytest
import zmq

from stgcnd.errors import UserError
from stgcnd.runtimes import available, gpu_present
from stgcnd.server.config import Config, ModelConfig, ServerConfig
from stgcnd.server.config_checks import check_config
from stgcnd_client import Client
from stgcnd_client.wire import decode_reply, encode_request
from tests.server.daemon_harness import Daemon

IPC = "ipc:///tmp/stgcnd-config-checks.sock"


def config(*models: ModelConfig, **server: object) -> Config:
    return Config(server=ServerConfig(endpoint=IPC, **server),  # type: ignore[arg-type]
                  models=models, source="test.toml")


def model(**keys: object) -> ModelConfig:
    return ModelConfig(name=str(keys.pop("name", "m")), demo=True, **keys)  # type: ignore[arg-type]


def refused(cfg: Config) -> str:
    with pytest.raises(UserError) as caught:
        check_config(cfg)
    return str(caught.value)


@pytest.mark.parametrize(("keys", "says"), [
    ({"backend": "onnxruntime", "precision": "bf16"},
     'use backend = "torch" (on a CPU with AVX512-BF16 or AMX)'),
    ({"backend": "onnxruntime", "precision": "int8"}, "set calibration = "),
    ({"backend": "noop", "precision": "int8"}, None),  # noop computes nothing: any precision
    # auto would serve another precision without calibration, said only in a log line
    # (issue #43): refused as a named backend is.
    ({"backend": "auto", "precision": "int8"}, "set calibration = "),
    ({"backend": "auto", "precision": "int8", "allow_synthetic_calibration": True}, None),
    ({"backend": "onnxruntime", "precision": "int8", "allow_synthetic_calibration": True}, None),
])
def test_backend_and_precision_rules(keys, says):
    cfg = config(model(**keys))
    if says is None:
        check_config(cfg)
    else:
        assert says in refused(cfg)


@pytest.mark.skipif(available()["torch"] is not None, reason="needs torch installed")
def test_torch_has_no_int8():
    says = refused(config(model(backend="torch", precision="int8")))
    assert 'backend = "torch" serves precision = "fp32" or "fp16" or "bf16", not "int8"' in says
    assert 'use backend = "onnxruntime" or "tensorrt" (with calibration)' in says
    assert "calibration windows" not in says  # torch would not use them anyway


def test_a_backend_that_is_not_installed_is_refused_first():
    missing = next((b for b in ("torch", "onnxruntime") if available()[b] is not None), None)
    if missing is None:
        pytest.skip("torch and onnxruntime are both installed")
    says = refused(config(model(backend=missing)))
    assert f'backend = "{missing}" cannot run on this machine' in says


@pytest.mark.skipif(available()["torch"] is not None, reason="needs torch installed")
@pytest.mark.skipif(gpu_present(), reason="a GPU answers here")
def test_torch_fp16_on_a_machine_without_a_gpu():
    says = refused(config(model(backend="torch", precision="fp16")))
    assert 'runs fp16 on CUDA only' in says and 'set precision = "fp32"' in says


@pytest.mark.skipif(gpu_present(), reason="a GPU answers here")
def test_cuda_without_a_gpu_and_every_problem_at_once():
    says = refused(config(model(name="a", backend="onnxruntime", device="cuda"),
                          model(name="b", backend="onnxruntime", precision="fp16")))
    assert says.startswith("test.toml: model 'a': device = \"cuda\", but no CUDA GPU")
    assert "; model 'b': backend = \"onnxruntime\" serves precision" in says


def test_endpoints_are_well_formed_and_reachable_ones_need_curve():
    assert "expected tcp://HOST:PORT" in refused(config(model(), events_endpoint="tcp://x"))
    assert 'curve = "off"' in refused(Config(server=ServerConfig(
        endpoint="tcp://0.0.0.0:5555", curve="off"), models=(model(),)))


def test_what_passes_says_what_was_not_checked():
    not_checked = check_config(config(model(backend="onnxruntime")))
    assert not_checked[0] == f"whether {IPC} is free to listen on (serve checks it at start)"
    assert "model 'm': that the onnxruntime engine builds and validates here" in not_checked


@pytest.mark.slow
def test_a_reload_refuses_what_a_start_refuses_and_keeps_serving(tmp_path):
    noop = '[[models]]\nname = "m"\ndemo = true\nbackend = "noop"\nframes = 30\n'
    d = Daemon(tmp_path, models=noop).start()
    try:
        with Client(d.endpoint, camera_id="steady") as c:
            c.infer(np.zeros((3, 30, 33, 1), np.float32))
            d.config_path.write_text(d.config_path.read_text().replace(
                'backend = "noop"', 'backend = "onnxruntime"\nprecision = "fp16"'))
            d.signal(signal.SIGHUP)
            assert "reload failed" in d.notify.wait_for("READY", timeout=60)["STATUS"]
            assert c.infer(np.zeros((3, 30, 33, 1), np.float32)).logits is not None
        [failed] = [e for e in d.log_events() if e.get("event") == "reload"
                    and e.get("phase") == "failed"]
        assert 'backend = "onnxruntime" serves precision' in failed["error"]
        assert not [e for e in d.log_events() if e.get("event") == "engine_build_started"]
        assert d.stop() == 0
    finally:
        d.stop()
        d.close()


@pytest.mark.slow
def test_a_reload_does_with_each_key_what_its_tag_says(tmp_path):
    """#33: queue_size, stats_interval and the socket options were silently not re-applied,
    and log_level had no effect at all. Now every key is tagged in the schema, and a reload
    that changes one of each kind does what the tag says: policy keys (queue_size,
    log_level) apply at once, a [server] engine key (warmup_runs) loads the model anew, and
    a restart key (max_cameras) is logged as waiting for a restart, its value kept."""
    noop = ('[[models]]\nname = "m"\ndemo = true\nbackend = "noop"\nframes = 30\n'
            'noop_compute_us = 300000\n')
    d = Daemon(tmp_path, models=noop, queue_size=8, log_level="info", max_cameras=64).start()
    window = np.zeros((3, 30, 33, 1), np.float32)

    def busy_replies() -> int:
        """Three windows of one camera sent at once: with queue_size 1, at least one is
        refused busy (one waits, or one runs and one waits); with 8, none is."""
        with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as s:
            s.connect(d.endpoint)
            for i in range(3):
                s.send_multipart(encode_request("infer", i + 1, "flood", arrays=[window]))
            replies = [decode_reply(s.recv_multipart()) for _ in range(3)]
        return sum(not r.ok and r.error.code == "busy" for r in replies)

    try:
        assert busy_replies() == 0
        text = d.config_path.read_text().replace("queue_size = 8", "queue_size = 1")
        text = text.replace('log_level = "info"', 'log_level = "debug"')
        text = text.replace("warmup_runs = 1", "warmup_runs = 2")
        d.config_path.write_text(text.replace("max_cameras = 64", "max_cameras = 16"))
        d.notify.skip_seen()
        d.signal(signal.SIGHUP)
        assert "reloaded" in d.notify.wait_for("READY", timeout=60)["STATUS"]
        assert busy_replies() >= 1
        with Client(d.endpoint, camera_id="steady") as c:
            c.infer(window)
        assert d.stop() == 0
        events = d.log_events()
        ignored = [e for e in events if e.get("event") == "reload_key_ignored"]
        assert [(e["key"], e["value"], e["kept"]) for e in ignored] == [("max_cameras", 16, 64)]
        [done] = [e for e in events if e.get("event") == "reload" and e.get("phase") == "done"]
        assert done["loaded"] == ["m"] and done["generation"] == 2
        assert [e for e in events if e.get("event") == "request"], "log_level not applied"
    finally:
        d.stop()
        d.close()


@pytest.mark.slow
def test_a_reload_keeps_the_values_serve_s_flags_gave(tmp_path):
    """A reload rereads the file and the environment, and keeps what serve's flags set: with
    --engines pointing elsewhere than the file's engines_dir (an engine key), a reload that
    changes only a policy key loads no model anew."""
    noop = '[[models]]\nname = "m"\ndemo = true\nbackend = "noop"\nframes = 30\n'
    d = Daemon(tmp_path, models=noop, queue_size=8)
    d.serve_args = ["--engines", str(tmp_path / "flag-engines")]
    d.start()
    try:
        d.config_path.write_text(d.config_path.read_text().replace("queue_size = 8",
                                                                   "queue_size = 4"))
        d.notify.skip_seen()
        d.signal(signal.SIGHUP)
        assert "reloaded" in d.notify.wait_for("READY", timeout=60)["STATUS"]
        assert d.stop() == 0
        [done] = [e for e in d.log_events() if e.get("event") == "reload"
                  and e.get("phase") == "done"]
        assert done["loaded"] == []
    finally:
        d.stop()
        d.close()
