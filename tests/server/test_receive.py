"""The receiver on a real ROUTER: a message with more frames than any request is cut short,
the rest dropped in chunks, and the next message read whole."""

from __future__ import annotations

import os

import pytest
import zmq

from stgcnd.server import receive
from stgcnd.server.receive import MAX_FRAMES, Receiver


@pytest.fixture
def pair(tmp_path):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc://{tmp_path / 'r.sock'}")
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"ipc://{tmp_path / 'r.sock'}")
    yield router, dealer
    router.close(0)
    dealer.close(0)
    ctx.term()


def wait_readable(router: zmq.Socket) -> None:
    assert router.poll(5000), "nothing arrived"


def test_a_request_is_read_whole_with_its_connection(pair):
    router, dealer = pair
    rx = Receiver(router)
    dealer.send_multipart([b"header", b"array"])
    wait_readable(router)
    msg = rx.read()
    assert msg is not None and not msg.too_many
    assert [f.bytes for f in msg.frames] == [b"header", b"array"]
    assert msg.fd > 2
    assert rx.read() is None


def test_too_many_frames_are_cut_short_then_dropped_in_chunks(pair, monkeypatch):
    router, dealer = pair
    monkeypatch.setattr(receive, "DISCARD_PER_PASS", 1000)
    rx = Receiver(router)
    dealer.send_multipart([b"header"] + [b""] * 5000)
    dealer.send_multipart([b"next"])
    wait_readable(router)
    first = rx.read()
    assert first is not None and first.too_many and len(first.frames) == MAX_FRAMES
    assert first.frames[0].bytes == b"header"
    passes, got = 0, []
    while rx.discarding or not got:
        if not rx.discarding:
            wait_readable(router)
        msg = rx.read()
        passes += 1
        if msg is not None:
            got.append(msg)
        assert passes < 100
    assert passes >= 5  # chunks of 1000: the loop got control back between them
    assert [[f.bytes for f in m.frames] for m in got] == [[b"next"]]
    assert rx.discarded_frames == 5001 - MAX_FRAMES
    assert rx.oversized_messages == 1


def test_the_loops_poll_saves_the_check_and_a_wrong_hint_reads_nothing(pair):
    """`waiting`: the loop's poll said a request is there, so the receiver does not ask again
    (issue #44); were it wrong, the read is None, never an exception out of the loop."""
    router, dealer = pair
    rx = Receiver(router)
    assert rx.read(waiting=True) is None        # nothing there: no zmq.Again escapes
    dealer.send_multipart([b"header", b"array"])
    wait_readable(router)
    msg = rx.read(waiting=True)
    assert msg is not None and [f.bytes for f in msg.frames] == [b"header", b"array"]
    assert msg.peer == f"pid:{os.getpid()}"
    dealer.send_multipart([b"again"])
    wait_readable(router)
    again = rx.read()
    assert again is not None and again.peer == msg.peer  # its key from the address's cache
    assert rx.read() is None
