"""docs/protocol.md's answers to issue #32's item 8, at the codec (stgcnd_client.protocol):
the id a reply echoes after a header-level failure, the error map's `reason` and `appended`,
numbers other packers write, and which check answers first. The daemon's side of the same
answers is tests/server/test_protocol_daemon.py."""

from __future__ import annotations

import struct
from pathlib import Path

import msgpack
import numpy as np
import pytest

from stgcnd_client import Busy, Reason, ShuttingDown
from stgcnd_client.errors import server_error
from stgcnd_client.protocol import (
    ErrorCode,
    ProtocolError,
    check_frame,
    decode_request,
    encode_reply,
    peek_id,
)
from stgcnd_client.wire import decode_reply, encode_request

PING = {"v": 1, "op": "ping", "id": 41, "camera": "cam"}


def refused(header: bytes, *arrays: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_request([header, *arrays])
    return info.value


@pytest.mark.parametrize(("header", "code"), [
    (msgpack.packb({**PING, "note": "x" * 2000}), ErrorCode.MALFORMED),     # a string too long
    (msgpack.packb({**PING, "note": "x" * 20_000}), ErrorCode.TOO_LARGE),   # header > 16 KiB
    (msgpack.packb({**PING, 7: "int key"}, strict_types=False), ErrorCode.MALFORMED),
    (msgpack.packb(PING) + b"\x00", ErrorCode.MALFORMED),                   # trailing bytes
    (msgpack.packb({**PING, **{f"k{i}": i for i in range(70)}}), ErrorCode.MALFORMED),
    (msgpack.packb({**PING, "tags": list(range(100))}), ErrorCode.MALFORMED),  # list > 64
])
def test_the_id_is_echoed_whenever_the_header_has_an_int_one(header, code):
    """8.1: a header that breaks a limit still names its request: the reply carries its id."""
    exc = refused(header)
    assert exc.code == code and exc.req_id == 41


@pytest.mark.parametrize("header", [
    msgpack.packb([1, 2]),                          # not a map
    msgpack.packb({**PING, "id": "41"}),            # not an int
    msgpack.packb({**PING, "id": 1.0}),             # a float is not an int either
    b"\xc1",                                        # not msgpack
    msgpack.packb({**PING, "id": True}),            # a bool is not an int
])
def test_the_id_is_nil_only_when_there_is_no_int_id(header):
    assert refused(header).req_id is None


def test_peek_reads_no_more_than_a_valid_header_may_hold():
    """The id after the 64th entry of an oversized map is not looked for."""
    late = {**{f"k{i}": i for i in range(64)}, "id": 9}
    assert peek_id(msgpack.packb(late)) is None
    assert peek_id(msgpack.packb({"id": 9, **{f"k{i}": i for i in range(64)}})) == 9


@pytest.mark.parametrize(("reason", "appended", "exc_type"), [
    (Reason.QUEUE_FULL, True, Busy), (Reason.NO_CAMERA_SLOT, False, Busy),
    (Reason.TOO_OFTEN, False, Busy),
    (Reason.STOPPING, True, ShuttingDown), (Reason.MODEL_REPLACED, True, ShuttingDown)])
def test_reason_and_appended_travel_in_the_error_map(reason, appended, exc_type):
    """8.2, 8.3: `busy` and `shutting-down` say why, a push's error whether its frame was
    appended; both are plain keys of the error map, next to code and message."""
    code = ErrorCode.BUSY if exc_type is Busy else ErrorCode.SHUTTING_DOWN
    (frame,) = encode_reply(7, error=ProtocolError(code, "no", 7, reason, appended))
    assert msgpack.unpackb(frame) == {"v": 1, "id": 7, "ok": False, "error": {
        "code": code.value, "message": "no", "reason": reason.value, "appended": appended}}
    info = decode_reply([frame]).error
    assert info is not None and (info.reason, info.appended) == (reason.value, appended)
    exc = server_error(info.code, info.message, info.reason, info.appended)
    assert type(exc) is exc_type and (exc.reason, exc.appended) == (reason.value, appended)


def test_an_error_map_without_the_new_keys_still_decodes():
    (frame,) = encode_reply(7, error=("busy", "queue full"))
    assert msgpack.unpackb(frame)["error"] == {"code": "busy", "message": "queue full"}
    info = decode_reply([frame]).error
    assert info is not None and info.reason is None and info.appended is None


@pytest.mark.parametrize("packed", [
    b"\xcc\xc8",               # uint 8: what msgpack-c writes for 200.0f and 200.0
    b"\xca" + struct.pack(">f", 200.0),   # float 32
    b"\xcb" + struct.pack(">d", 200.0),   # float 64
])
def test_timeout_ms_takes_any_msgpack_number(packed):
    """8.12: msgpack-c writes whole float32 values (not only doubles) as ints."""
    header = msgpack.packb({**PING, "timeout_ms": None})
    header = header.replace(b"\xaatimeout_ms\xc0", b"\xaatimeout_ms" + packed)
    assert decode_request([header]).timeout_ms == 200.0


def test_the_frame_size_is_checked_before_its_shape():
    """8.13: bad-size (the frame's bytes against the header's own shape) is decoding;
    bad-shape (the header's shape against the model's) comes after, at admission."""
    frame = np.zeros((3, 33, 1), np.float32)
    header, data = encode_request("push", 3, "cam", None, [frame])
    assert refused(header, data[:-4]).code == ErrorCode.BAD_SIZE
    wrong = np.zeros((3, 17, 1), np.float32)  # decodes, then is not the model's frame
    req = decode_request(encode_request("push", 3, "cam", None, [wrong]))
    with pytest.raises(ProtocolError) as info:
        check_frame(req.arrays[0], (3, 30, 33, 1))
    assert info.value.code == ErrorCode.BAD_SHAPE


def test_the_error_map_says_every_reason_in_one_of_its_tables():
    """The reasons' tables are generated from stgcnd_client.codes (tests/test_generated_docs.py
    checks they are current); here, that they stand where the error map is told."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    error_map = text[text.index("**The error map.**"):text.index("\n## 5.")]
    for reason in Reason:
        assert f"| `{reason.value}` |" in error_map, f"{reason}: not a row of the reasons' table"
    assert "`appended` (bool)" in error_map


def test_the_reasons_are_explained_in_the_protocol_document_only():
    """One place: the client's README and its Busy error point at the error map."""
    root = Path(__file__).resolve().parents[2]
    for path in (root / "clients" / "README.md", root / "clients" / "stgcnd_client" / "errors.py"):
        text = path.read_text()
        assert not [r for r in Reason if f'"{r.value}"' in text or f"`{r.value}`" in text], path
