"""docs/protocol.md's answers to issue #32's item 8, on the wire: a real `stgcnd serve` (noop
models, one whose batches take 0.4 s so that work queues as on a busy device) and raw
DEALER sockets sending what a client written from the document sends. The codec's side of
the same answers is tests/clients/test_protocol_decisions.py."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import zmq

from stgcnd.server.requests import refusal
from stgcnd_client.protocol import ErrorCode, ProtocolError, Reason
from stgcnd_client.wire import decode_reply, encode_request
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


def test_busy_says_the_queue_is_full_and_a_push_that_its_frame_was_kept(dealer):
    """8.2, 8.3: `reason` tells the two kinds of `busy` apart, `appended` whether a push's
    frame is in the window."""
    for i in range(1, 5):  # one runs, two wait (queue_size 2), the rest are refused
        send(dealer, "infer", i, "queue-infer", "slow", (WINDOW,))
    busy = [r for r in replies(dealer, 4) if not r["ok"]]
    assert busy and all(r["error"]["code"] == "busy" for r in busy)
    assert all(r["error"]["reason"] == "queue-full" for r in busy)
    assert all("appended" not in r["error"] for r in busy)  # an infer has no frame to keep

    next_id = fill_window(dealer, "queue-push", "slow")
    for i in range(next_id, next_id + 4):  # each completes a window: a prediction each
        send(dealer, "push", i, "queue-push", "slow", (FRAME,))
    busy = [r for r in replies(dealer, 4) if not r["ok"]]
    assert busy and all((r["error"]["reason"], r["error"]["appended"]) == ("queue-full", True)
                        for r in busy)
    send(dealer, "push", next_id + 4, "queue-push", "slow", (FRAME,), timeout_ms=0)
    (last,) = replies(dealer, 1)
    assert last["error"]["appended"] is True
    send(dealer, "reset", next_id + 5, "queue-push", "slow")
    replies(dealer, 1)


def test_a_push_refused_before_its_window_says_it_was_not_appended(dealer):
    send(dealer, "push", 1, "bad-frame", "fast", (np.zeros((3, 17, 1), np.float32),))
    (reply,) = replies(dealer, 1)
    assert (reply["error"]["code"], reply["error"]["appended"]) == ("bad-shape", False)
    send(dealer, "push", 2, "bad-frame", "fast", (FRAME,))
    assert replies(dealer, 1)[0]["result"]["seq"] == 1  # nothing was appended before


def test_a_refusal_says_appended_from_where_it_was_refused_and_leaves_the_error_as_it_was():
    """#44: the request path says whether a push's frame is in the window where it appends
    it (or refuses before), not by writing on the exception it raised."""
    busy = ProtocolError(ErrorCode.BUSY, "slow down", 7, Reason.QUEUE_FULL)
    for appended in (True, False):
        error = msgpack.unpackb(refusal(7, busy, appended)[0])["error"]
        assert error == {"code": "busy", "message": "slow down", "reason": "queue-full",
                         "appended": appended}
    assert "appended" not in msgpack.unpackb(refusal(7, busy, None)[0])["error"]  # an infer
    assert busy.appended is None


def test_timeout_zero_appends_and_expires_only_the_prediction(dealer):
    """8.4: `timeout_ms` bounds the prediction: a push that makes none is answered ok at
    once, even with 0; one that makes one due keeps its frame and is answered expired."""
    send(dealer, "push", 1, "zero", "fast", (FRAME,), timeout_ms=0)
    (first,) = replies(dealer, 1)
    assert first["ok"] and first["result"]["seq"] == 1 and not first["result"]["ready"]
    for i in range(2, FRAMES):
        send(dealer, "push", i, "zero", "fast", (FRAME,))
        replies(dealer, 1)
    send(dealer, "push", FRAMES, "zero", "fast", (FRAME,), timeout_ms=0)
    (due,) = replies(dealer, 1)
    assert (due["error"]["code"], due["error"]["appended"]) == ("expired", True)
    send(dealer, "push", FRAMES + 1, "zero", "fast", (FRAME,))
    assert replies(dealer, 1)[0]["result"]["seq"] == FRAMES + 1


def test_replies_to_pipelined_requests_come_as_they_are_ready(dealer):
    """8.5: a refusal, an answer that needs no device and another model's prediction all
    overtake a prediction still running: match replies by id, never by order."""
    send(dealer, "infer", 1, "pipelined", "slow", (WINDOW,))
    send(dealer, "infer", 2, "pipelined", "slow", (np.zeros((3, 5, 33, 1), np.float32),))
    send(dealer, "ping", 3, "pipelined")
    send(dealer, "infer", 4, "pipelined", "fast", (WINDOW,))
    got = replies(dealer, 4)
    assert [r["id"] for r in got][-1] == 1
    assert {r["id"]: r["ok"] for r in got} == {1: True, 2: False, 3: True, 4: True}


@pytest.mark.parametrize("op", ["hello", "ping", "stats", "reset", "infer", "push"])
def test_an_unknown_model_is_refused_by_every_op(dealer, op):
    """8.6: before, hello, ping and stats ignored the model they were given."""
    arrays = {"infer": (WINDOW,), "push": (FRAME,)}.get(op, ())
    send(dealer, op, 77, "unknown-model", "nope", arrays)
    (reply,) = replies(dealer, 1)
    assert (reply["id"], reply["error"]["code"]) == (77, "unknown-model")
    assert "fast, slow" in reply["error"]["message"]


def test_the_model_is_checked_before_the_shape(dealer):
    """8.13: unknown-model before bad-shape, bad-size before both."""
    send(dealer, "push", 5, "order", "nope", (np.zeros((3, 17, 1), np.float32),))
    assert replies(dealer, 1)[0]["error"]["code"] == "unknown-model"
    header, data = encode_request("push", 6, "order", "nope", [FRAME])
    dealer.send_multipart([header, data[:-4]])
    assert replies(dealer, 1)[0]["error"]["code"] == "bad-size"


def test_no_camera_slot_and_shutting_down_say_why_and_whether_the_frame_was_kept(tmp_path):
    """8.2, 8.3 with a daemon of its own: two camera slots (one for cameras never served),
    and a drain that ends before the queued push could run."""
    d = Daemon(tmp_path, models=MODELS, max_cameras=2, drain_timeout=0.1).start()
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(d.endpoint)
    try:
        next_id = fill_window(s, "holder", "slow")
        send(s, "push", next_id, "holder", "slow", (FRAME,))      # runs for 0.4 s
        send(s, "push", next_id + 1, "holder", "slow", (FRAME,))  # waits behind it
        send(s, "push", 1, "newcomer", "slow", (FRAME,))          # no slot: holder is busy
        (slot,) = replies(s, 1)
        assert slot["error"]["code"] == "busy"
        assert (slot["error"]["reason"], slot["error"]["appended"]) == ("no-camera-slot", False)
        d.signal(signal.SIGTERM)  # the drain ends before the waiting push can run
        ran, stopped = replies(s, 2)
        assert ran["id"] == next_id and ran["ok"]
        assert stopped["id"] == next_id + 1 and stopped["error"]["code"] == "shutting-down"
        assert (stopped["error"]["reason"], stopped["error"]["appended"]) == ("stopping", True)
    finally:
        s.close(0)
        stop_by_pid(d)


def test_replies_decode_with_the_client_library(dealer):
    """The new keys are optional keys of the error map: the client reads them as it is."""
    send(dealer, "push", 9, "decoded", "fast", (np.zeros((3, 17, 1), np.float32),))
    raw = dealer.recv_multipart() if dealer.poll(5000) else []
    info = decode_reply(raw).error
    assert info is not None and info.code == "bad-shape" and info.appended is False
