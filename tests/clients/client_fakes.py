"""A tiny protocol-v1 daemon for the client tests: a ROUTER socket served by a thread."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import zmq

from stgcnd_client.protocol import ProtocolError, Request, decode_request, encode_reply

FRAMES = 4  # window length T of the fake daemon's model
LABELS = ["normal", "shoplifting"]

# typing.Callable: subscripting collections.abc.Callable at runtime needs Python 3.9, and
# the tests run on 3.8 too (JetPack 5).
Handler = Callable[[Request], "list[list[bytes]]"]


def fake_prediction(window: np.ndarray) -> dict:
    """What the fake model answers for a window: logits = (sum, mean) of its values."""
    w = window.astype(np.float64)
    logits = np.array([w.sum(), w.mean()])
    exp = np.exp(logits - logits.max())
    probs = exp / exp.sum()
    label = int(np.argmax(logits))
    return {
        "model": "single",
        "logits": logits.tolist(),
        "probs": probs.tolist(),
        "label": label,
        "label_name": LABELS[label],
        "timings": {"queue_ms": 0.5, "compute_ms": 1.5, "total_ms": 2.0},
    }


class FakeModelServer:
    """Answers like a daemon with one model "single" of input shape (3, FRAMES, 2, 1)."""

    input_shape = (3, FRAMES, 2, 1)

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, str], list[np.ndarray]] = {}
        self.seq: dict[tuple[str, str], int] = {}

    def __call__(self, req: Request) -> list[list[bytes]]:
        if req.op == "hello":
            model = {
                "name": "single",
                "input_shape": list(self.input_shape),
                "num_class": 2,
                "labels": LABELS,
                "backend": "fake",
                "precision": "fp32",
                "default": True,
                "stride": 1,
            }
            result = {"server": "fake-0", "protocol": 1, "camera": req.camera, "models": [model]}
        elif req.op == "infer":
            result = fake_prediction(req.arrays[0])
        elif req.op == "push":
            key = (req.camera, req.model or "single")
            frames = self.buffers.setdefault(key, [])
            frames.append(np.array(req.arrays[0]))
            del frames[:-FRAMES]
            self.seq[key] = self.seq.get(key, 0) + 1
            result = {"model": key[1], "ready": len(frames) == FRAMES, "frames": len(frames)}
            result["seq"] = self.seq[key]
            if result["ready"]:
                result.update(fake_prediction(np.stack(frames, axis=1)))
        elif req.op == "reset":
            names = [req.model] if req.model else ["single"]
            for name in names:
                self.buffers.pop((req.camera, name), None)
            result = {"reset": names}
        elif req.op == "ping":
            result = {"pong": True, "server_time": 1.0}
        else:
            result = {"requests": 1}
        return [encode_reply(req.id, result)]


class FakeDaemon:
    """A ROUTER socket served by a thread; ``handler`` decides the replies to each request.

    Everything received is kept in ``received`` as (identity, Request) for the test to inspect.
    """

    def __init__(self, endpoint: str, handler: Handler) -> None:
        self.endpoint = endpoint
        self.handler = handler
        self.received: list[tuple[bytes, Request]] = []
        self._ctx = zmq.Context()
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FakeDaemon:
        self._thread.start()
        if not self._bound.wait(5):
            raise RuntimeError("fake daemon did not bind")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._ctx.term()

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.bind(self.endpoint)
        self._bound.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(20):
                    continue
                identity, *body = sock.recv_multipart()
                try:
                    req = decode_request(body)
                except ProtocolError as exc:
                    replies = [encode_reply(exc.req_id, error=exc)]
                else:
                    self.received.append((identity, req))
                    replies = self.handler(req)
                for reply in replies:
                    try:
                        sock.send_multipart([identity, *reply])
                    except zmq.ZMQError:
                        pass  # the client's socket is gone (it reconnected); as a daemon would
        finally:
            sock.close(0)
