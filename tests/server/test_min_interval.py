"""A model's `min_interval_ms`: a camera's infer or push to it that comes sooner after the last
one let through is answered `busy` `too-often` (not queued, not run, a push's frame not
appended), per camera and per model; 0, the default, is off; a reload (SIGHUP) applies it to
the model it keeps serving; skeleton quality counts each refused request sent once. On an
in-process Server with the noop backend, serving on its real sockets."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from structlog.testing import capture_logs

from stgcnd.server.config import load_config
from stgcnd.server.notify import Notifier
from stgcnd.server.server import Server
from stgcnd.server.wakeup import Wakeup
from stgcnd_client import Busy, Client
from tests.server.daemon_harness import write_config

NOOP = '[[models]]\nname = "demo"\nbackend = "noop"\ndemo = true\nframes = 30\n'
MINUTE_MS = 60_000  # far longer than the test: a second request within it is always too soon


def test_a_camera_faster_than_min_interval_ms_is_told_too_often(tmp_path):
    endpoint = f"ipc://{tmp_path / 'd.sock'}"
    path = tmp_path / "stgcnd.toml"
    config = load_config(write_config(path, endpoint, tmp_path / "engines", models=NOOP))
    server = Server(config, Wakeup(), Notifier(env={}), lambda: load_config(path))
    model = server.models["demo"]
    window = np.zeros(model.input_shape, np.float32)
    thread = threading.Thread(target=server.serve, name="serve", daemon=True)
    with capture_logs() as logs:
        thread.start()
        try:
            with Client(endpoint, camera_id="a", retries=0) as a, \
                    Client(endpoint, camera_id="b", retries=0) as b:
                for _ in range(2):  # off by default: back to back, both let through
                    a.push(window[:, -1])
                write_config(path, endpoint, tmp_path / "engines",
                             models=NOOP + f"min_interval_ms = {MINUTE_MS}\n")
                server.wakeup.reload.set()  # what SIGHUP does
                server.wakeup.wake()
                deadline = time.monotonic() + 30
                while server.models["demo"].config.min_interval_ms != MINUTE_MS:
                    assert time.monotonic() < deadline, "the reload did not apply the key"
                    time.sleep(0.01)
                assert server.models["demo"] is model  # applied, not a model loaded anew
                a.push(window[:, -1])
                with pytest.raises(Busy) as too_soon:
                    a.push(window[:, -1])
                assert (too_soon.value.reason, too_soon.value.appended) == ("too-often", False)
                assert f"min_interval_ms={MINUTE_MS}" in str(too_soon.value)
                with pytest.raises(Busy) as infer:  # the model's interval, whatever the op
                    a.infer(window)
                assert infer.value.reason == "too-often"
                b.push(window[:, -1])  # another camera has its own interval
                assert server.requests.cameras.cameras["a"].rings["demo"].received == 3
        finally:
            server.wakeup.stop.set()
            server.wakeup.wake()
            thread.join(30)
    assert not thread.is_alive()
    quality = [e for e in logs if e["event"] == "skeleton_quality" and e["camera"] == "a"]
    assert {k: sum(int(r[k]) for r in quality) for k in ("sent", "frames", "refused_busy")} \
        == {"sent": 5, "frames": 3, "refused_busy": 2}
