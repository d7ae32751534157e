"""docs/protocol.md's answers to issue #32's item 8, on the wire: a real `stgcnd serve` (noop
models, one whose batches take 0.4 s so that work queues as on a busy device) and raw
DEALER sockets sending what a client written from the document sends. The codec's side of
the same answers is tests/clients/test_protocol_decisions.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import zmq

from stgcnd_client.protocol import encode_request
from tests.server.daemon_harness import Daemon, stop_by_pid

pytestmark = pytest.mark.slow

FRAMES = 20
SLOW_S = 0.4
MODELS = (f'[[models]]\nname = "fast"\nbackend = "noop"\ndemo = true\nframes = {FRAMES}\n'
          f'[[models]]\nname = "slow"\nbackend = "noop"\ndemo = true\nframes = {FRAMES}\n'
          f'max_batch = 1\nbuckets = [1]\nnoop_compute_us = {int(SLOW_S * 1e6)}\n')
WINDOW = np.zeros((3, FRAMES, 33, 1), np.float32)
FRAME = np.zeros((3, 33, 1), np.float32)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("protocol"), models=MODELS, queue_size=2).start()
    yield d
    stop_by_pid(d)


@pytest.fixture
def dealer(daemon: Daemon) -> Iterator[zmq.Socket]:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(daemon.endpoint)
    yield s
    s.close(0)


def replies(sock: zmq.Socket, count: int, timeout: float = 10.0) -> list[dict]:
    """The next `count` replies, in the order they came, as plain maps."""
    out = []
    end = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < end:
        if sock.poll(100):
            out.append(msgpack.unpackb(sock.recv_multipart()[0], raw=False))
    assert len(out) == count, out
    return out


def send(sock: zmq.Socket, op: str, req_id: int, camera: str, model: str | None = None,
         arrays: tuple[np.ndarray, ...] = (), timeout_ms: float | None = None) -> None:
    sock.send_multipart(encode_request(op, req_id, camera, model, arrays, timeout_ms))


def fill_window(sock: zmq.Socket, camera: str, model: str) -> int:
    """Push FRAMES - 1 frames (no prediction yet); the next id."""
    for i in range(1, FRAMES):
        send(sock, "push", i, camera, model, (FRAME,))
        (reply,) = replies(sock, 1)
        assert reply["ok"] and not reply["result"]["ready"], reply
    return FRAMES


def test_the_id_is_echoed_after_header_failures(dealer):
    """8.1: the reply names the request whenever its header had an int id."""
    ping = {"v": 1, "op": "ping", "id": 41, "camera": "cam"}
    dealer.send(msgpack.packb({**ping, "note": "x" * 2000}))           # a string too long
    dealer.send(msgpack.packb({**ping, "id": 42, "note": "x" * 20_000}))  # header > 16 KiB
    dealer.send(msgpack.packb({**ping, "id": 43}) + b"\x00")          # trailing bytes
    dealer.send(msgpack.packb([1, 2]))                                 # no id to echo
    got = [(r["id"], r["error"]["code"]) for r in replies(dealer, 4)]
    assert got == [(41, "malformed"), (42, "too-large"), (43, "malformed"), (None, "malformed")]


