"""Issue #44: skeleton quality's `sent` (which drives feed health's `blocked` and `silent`)
must count every infer and push once, whatever refused it and wherever. It assumed that a
`busy` push of a known camera had had its frame counted, so a busy reason added at admission
(before the frame reaches the window) silently undercounted `sent`. Every declared refusal
reason (stgcnd_client.codes.REASONS) is raised here at both places a request can be refused:
at admission (the camera has its slot, the pose is not counted) and at its queue (a push's
frame is in the window and counted), on an in-process Server serving on its real sockets;
the `skeleton_quality` lines must add up to what was sent."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from structlog.testing import capture_logs

import stgcnd.server.requests as request_path
from stgcnd.server.config import load_config
from stgcnd.server.notify import Notifier
from stgcnd.server.server import Server
from stgcnd.server.wakeup import Wakeup
from stgcnd_client import Client, ServerError
from stgcnd_client.codes import REASONS
from stgcnd_client.protocol import ErrorCode, ProtocolError, Reason
from tests.server.daemon_harness import write_config

MAX_PUSHES = 64  # a push meets its queue once its frame makes a prediction due
NOOP = '[[models]]\nname = "demo"\nbackend = "noop"\ndemo = true\nframes = 30\n'


def refused_everywhere(tmp_path, monkeypatch) -> tuple[list[dict], dict[str, dict[str, int]]]:
    """Each (op, place, reason) on a camera of its own: what each camera's requests must add
    up to (sent, frames, refused_busy), and the skeleton_quality lines the daemon logged."""
    endpoint = f"ipc://{tmp_path / 'd.sock'}"
    config = load_config(write_config(tmp_path / "stgcnd.toml", endpoint, tmp_path / "engines",
                                      models=NOOP, max_cameras=64))
    server = Server(config, Wakeup(), Notifier(env={}), lambda: config)
    model = next(iter(server.models.values()))
    window = np.zeros(model.input_shape, np.float32)
    refusal: dict[str, tuple[str, ProtocolError]] = {}  # camera -> (place, what it gets)
    admit, submit = request_path.admit, model.scheduler.submit

    def admitted(req, *args):
        got = admit(req, *args)  # the camera has its slot: a known one is refused
        place, exc = refusal.get(req.camera, ("", None))
        if place == "admission":
            raise ProtocolError(exc.code, exc.message, req.id, exc.reason)
        return got

    def queued(job):
        place, exc = refusal.get(job.camera, ("", None))
        if place == "queue":
            raise ProtocolError(exc.code, exc.message, job.req_id, exc.reason)
        return submit(job)

    monkeypatch.setattr(request_path, "admit", admitted)
    monkeypatch.setattr(model.scheduler, "submit", queued)
    expected: dict[str, dict[str, int]] = {}
    thread = threading.Thread(target=server.serve, name="serve", daemon=True)
    with capture_logs() as logs:
        thread.start()
        try:
            for doc in REASONS.values():
                for op in ("infer", "push"):
                    for place in ("admission", "queue"):
                        camera = f"{op}-{place}-{doc.value}"
                        refusal[camera] = (place, ProtocolError(doc.code, "injected",
                                                                reason=Reason(doc.value)))
                        expected[camera] = send(endpoint, camera, op, place, window,
                                                ErrorCode(doc.code))
            with Client(endpoint, camera_id="nan", retries=0) as nan, \
                    pytest.raises(ServerError):
                nan.infer(np.full(model.input_shape, np.nan, np.float32))
            expected["nan"] = {"sent": 1, "frames": 0, "refused_busy": 0, "refused_input": 1}
        finally:
            server.wakeup.stop.set()
            server.wakeup.wake()
            thread.join(30)
    assert not thread.is_alive()
    return [e for e in logs if e["event"] == "skeleton_quality"], expected


def send(endpoint: str, camera: str, op: str, place: str, window: np.ndarray,
         code: ErrorCode) -> dict[str, int]:
    """Infer once, or push until refused; what the camera's lines must add up to: each push
    before the refusal sent and its frame counted; the refused one's frame counted where it
    reached the window (the queue), and sent once either way when busy (a shutting-down
    refusal is the daemon's, not the feed's: not sent, but for a frame counted)."""
    pushes = 0
    with Client(endpoint, camera_id=camera, retries=0) as client:
        with pytest.raises(ServerError) as refused:
            if op == "infer":
                client.infer(window)
            while op == "push" and pushes < MAX_PUSHES:
                pushes += 1
                client.push(window[:, -1])
        assert refused.value.code == code.value, camera
    counted = op == "push" and place == "queue"
    frames = max(pushes - 1, 0) + counted
    busy = code == ErrorCode.BUSY
    return {"sent": frames + (busy and not counted), "frames": frames,
            "refused_busy": int(busy), "refused_input": 0}


def test_every_refusal_reason_keeps_skeleton_quality_counting_right(tmp_path, monkeypatch):
    lines, expected = refused_everywhere(tmp_path, monkeypatch)
    got = {camera: {k: sum(int(r[k]) for r in lines if r["camera"] == camera)
                    for k in ("sent", "frames", "refused_busy", "refused_input")}
           for camera in expected}
    assert got == expected
    blocked = {r["camera"] for r in lines if r["blocked"]}
    assert blocked == {c for c, e in expected.items() if e["refused_busy"] and not e["frames"]}
