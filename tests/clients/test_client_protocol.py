"""Protocol v1 encode/decode: round trips, and every malformed message -> its error code."""

from __future__ import annotations

import math
import struct

import msgpack
import numpy as np
import pytest
import zmq

from stgcnd_client.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    ErrorCode,
    ErrorInfo,
    Limits,
    Op,
    ProtocolError,
    check_frame,
    check_window,
    decode_request,
    encode_reply,
)
from stgcnd_client.wire import decode_reply, encode_request


def header(**overrides):
    """A valid infer header for one (3, 2, 2, 1) float32 window, with fields replaced."""
    h = {
        "v": 1,
        "op": "infer",
        "id": 7,
        "camera": "cam-1",
        "model": None,
        "timeout_ms": 100.0,
        "arrays": [{"dtype": "float32", "shape": [3, 2, 2, 1]}],
    }
    for key, value in overrides.items():
        if value is DROP:
            h.pop(key)
        else:
            h[key] = value
    return h


DROP = object()
WINDOW_BYTES = struct.pack("<12f", *range(12))


def frames_of(h, *arrays):
    return [msgpack.packb(h), *arrays]


# --------------------------------------------------------------------------- round trips


def test_protocol_constants():
    assert PROTOCOL_VERSION == 1
    assert DEFAULT_MAX_MESSAGE_BYTES >= 3 * 150 * 33 * 4 * 4  # a 4-person float32 window fits
    assert str(ErrorCode.BAD_SHAPE) == "bad-shape"
    assert ErrorCode.BUSY == "busy"


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_request_round_trip(dtype):
    window = np.arange(3 * 5 * 4 * 2, dtype=dtype).reshape(3, 5, 4, 2) / 7
    frames = encode_request(
        Op.INFER, 42, "cam-9", model="two", arrays=[window], timeout_ms=250, extra="x"
    )
    assert len(frames) == 2
    raw_header = msgpack.unpackb(frames[0])
    assert raw_header["v"] == 1 and raw_header["op"] == "infer"
    assert raw_header["arrays"] == [
        {"dtype": np.dtype(dtype).name, "shape": [3, 5, 4, 2]}
    ]
    req = decode_request(frames)
    assert (req.op, req.id, req.camera, req.model) == ("infer", 42, "cam-9", "two")
    assert req.timeout_ms == 250.0
    assert req.fields == {"extra": "x"}
    assert req.nbytes == sum(len(f) for f in frames)
    (got,) = req.arrays
    assert got.dtype == np.dtype(dtype) and got.shape == window.shape
    np.testing.assert_array_equal(got, window)


def test_arrays_go_out_little_endian_and_c_contiguous():
    native = np.arange(24, dtype=np.float32).reshape(3, 2, 4, 1)
    big_fortran = np.asfortranarray(native.astype(">f4"))
    frames = encode_request("infer", 1, "c", arrays=[big_fortran])
    assert frames[1] == struct.pack("<24f", *range(24))
    np.testing.assert_array_equal(decode_request(frames).arrays[0], native)


def test_decoded_arrays_are_read_only_views_of_the_frames():
    buf = bytearray(WINDOW_BYTES)
    req = decode_request([msgpack.packb(header()), buf])
    array = req.arrays[0]
    assert not array.flags.writeable
    buf[0:4] = struct.pack("<f", 99.0)  # the array sees the frame's memory: no copy was made
    assert array[0, 0, 0, 0] == 99.0


def test_zmq_frames_are_accepted():
    frames = [zmq.Frame(msgpack.packb(header())), zmq.Frame(WINDOW_BYTES)]
    req = decode_request(frames)
    np.testing.assert_array_equal(req.arrays[0].ravel(), np.arange(12, dtype=np.float32))


def test_ops_without_arrays():
    for op in ("hello", "reset", "ping", "stats"):
        req = decode_request(encode_request(op, 3, "cam"))
        assert req.op == op and req.arrays == () and req.model is None
        assert req.timeout_ms is None


def test_arrays_key_may_be_omitted_for_ops_without_arrays():
    h = header(op="ping", arrays=DROP)
    assert decode_request(frames_of(h)).op == "ping"


def test_encode_request_refuses_what_the_wire_cannot_carry():
    with pytest.raises(ProtocolError) as info:
        encode_request("infer", 1, "c", arrays=[np.zeros((3, 2, 2, 1))])  # float64
    assert info.value.code is ErrorCode.BAD_DTYPE
    with pytest.raises(ValueError, match="clash"):
        encode_request("ping", 1, "c", v=2)


# --------------------------------------------------------------------------- malformed


MALFORMED_CASES = [
    # (name, frames, expected code, expected echoed id)
    ("empty message", [], ErrorCode.MALFORMED, None),
    ("not msgpack", [b"\xc1", WINDOW_BYTES], ErrorCode.MALFORMED, None),
    ("truncated msgpack", [msgpack.packb(header())[:-3], WINDOW_BYTES], ErrorCode.MALFORMED, 7),
    ("trailing bytes", [msgpack.packb(header()) + b"\x00", WINDOW_BYTES], "malformed", 7),
    ("header is a list", [msgpack.packb([1, "infer"])], ErrorCode.MALFORMED, None),
    ("non-string map key", [msgpack.packb({1: 2})], ErrorCode.MALFORMED, None),
    ("ext type", [msgpack.packb({"v": msgpack.ExtType(5, b"xx")})], ErrorCode.MALFORMED, None),
    ("bin in header", frames_of(header(camera=b"cam"), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("string too long", frames_of(header(camera="c" * 5000), WINDOW_BYTES), "malformed", 7),
    ("missing v", frames_of(header(v=DROP), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("v is a string", frames_of(header(v="1"), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("v is a bool", frames_of(header(v=True), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("v is 2", frames_of(header(v=2), WINDOW_BYTES), ErrorCode.UNSUPPORTED_VERSION, 7),
    ("v is 0", frames_of(header(v=0), WINDOW_BYTES), ErrorCode.UNSUPPORTED_VERSION, 7),
    ("missing id", frames_of(header(id=DROP), WINDOW_BYTES), ErrorCode.MALFORMED, None),
    ("id is a string", frames_of(header(id="7"), WINDOW_BYTES), ErrorCode.MALFORMED, None),
    ("id is a float", frames_of(header(id=7.0), WINDOW_BYTES), ErrorCode.MALFORMED, None),
    ("missing op", frames_of(header(op=DROP), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("op is a number", frames_of(header(op=1), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("unknown op", frames_of(header(op="dance"), WINDOW_BYTES), ErrorCode.UNKNOWN_OP, 7),
    ("op in capitals", frames_of(header(op="INFER"), WINDOW_BYTES), ErrorCode.UNKNOWN_OP, 7),
    ("missing camera", frames_of(header(camera=DROP), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("empty camera", frames_of(header(camera=""), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("camera too long", frames_of(header(camera="c" * 200), WINDOW_BYTES), "malformed", 7),
    ("model is a number", frames_of(header(model=3), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("timeout is text", frames_of(header(timeout_ms="5"), WINDOW_BYTES), "malformed", 7),
    ("timeout is NaN", frames_of(header(timeout_ms=math.nan), WINDOW_BYTES), "malformed", 7),
    ("timeout is inf", frames_of(header(timeout_ms=math.inf), WINDOW_BYTES), "malformed", 7),
    ("timeout negative", frames_of(header(timeout_ms=-1), WINDOW_BYTES), "malformed", 7),
    ("timeout is a bool", frames_of(header(timeout_ms=True), WINDOW_BYTES), "malformed", 7),
    ("arrays is a map", frames_of(header(arrays={}), WINDOW_BYTES), ErrorCode.MALFORMED, 7),
    ("array spec is a list", frames_of(header(arrays=[[1]]), WINDOW_BYTES), "malformed", 7),
    (
        "array without dtype",
        frames_of(header(arrays=[{"shape": [3, 2, 2, 1]}]), WINDOW_BYTES),
        ErrorCode.MALFORMED,
        7,
    ),
    (
        "float64 dtype",
        frames_of(header(arrays=[{"dtype": "float64", "shape": [3, 2, 2, 1]}]), WINDOW_BYTES * 2),
        ErrorCode.BAD_DTYPE,
        7,
    ),
    (
        "numpy dtype string",
        frames_of(header(arrays=[{"dtype": "<f4", "shape": [3, 2, 2, 1]}]), WINDOW_BYTES),
        ErrorCode.BAD_DTYPE,
        7,
    ),
    (
        "shape not a list",
        frames_of(header(arrays=[{"dtype": "float32", "shape": 12}]), WINDOW_BYTES),
        ErrorCode.MALFORMED,
        7,
    ),
    (
        "shape of floats",
        frames_of(header(arrays=[{"dtype": "float32", "shape": [3.0, 4.0]}]), WINDOW_BYTES),
        ErrorCode.MALFORMED,
        7,
    ),
    (
        "negative dimension",
        frames_of(header(arrays=[{"dtype": "float32", "shape": [-3, -4]}]), WINDOW_BYTES),
        ErrorCode.BAD_SHAPE,
        7,
    ),
    (
        "too many dimensions",
        frames_of(header(arrays=[{"dtype": "float32", "shape": [1] * 9}]), b"\0" * 4),
        ErrorCode.BAD_SHAPE,
        7,
    ),
    ("array frame missing", frames_of(header()), ErrorCode.MALFORMED, 7),
    ("extra frame", frames_of(header(), WINDOW_BYTES, b"junk"), ErrorCode.MALFORMED, 7),
    ("infer without array", frames_of(header(arrays=[])), ErrorCode.MALFORMED, 7),
    (
        "ping with an array",
        frames_of(header(op="ping"), WINDOW_BYTES),
        ErrorCode.MALFORMED,
        7,
    ),
    ("frame one byte short", frames_of(header(), WINDOW_BYTES[:-1]), ErrorCode.BAD_SIZE, 7),
    ("frame too long", frames_of(header(), WINDOW_BYTES + b"\0\0"), ErrorCode.BAD_SIZE, 7),
    (
        "float16 bytes under a float32 header",
        frames_of(header(), np.zeros((3, 2, 2, 1), np.float16).tobytes()),
        ErrorCode.BAD_SIZE,
        7,
    ),
    (
        "huge declared shape",
        frames_of(header(arrays=[{"dtype": "float32", "shape": [2**40, 2**40]}]), WINDOW_BYTES),
        ErrorCode.BAD_SIZE,
        7,
    ),
]


@pytest.mark.parametrize(
    ("frames", "code", "req_id"),
    [case[1:] for case in MALFORMED_CASES],
    ids=[case[0] for case in MALFORMED_CASES],
)
def test_malformed_requests_get_the_right_code(frames, code, req_id):
    with pytest.raises(ProtocolError) as info:
        decode_request(frames)
    assert info.value.code == code
    assert info.value.req_id == req_id
    assert info.value.message  # every error says what was expected


def test_too_large_message_keeps_the_id():
    limits = Limits(max_message_bytes=len(msgpack.packb(header())) + len(WINDOW_BYTES) - 1)
    with pytest.raises(ProtocolError) as info:
        decode_request(frames_of(header(), WINDOW_BYTES), limits)
    assert (info.value.code, info.value.req_id) == (ErrorCode.TOO_LARGE, 7)
    assert str(limits.max_message_bytes) in info.value.message
    # one byte more and the same message is fine
    limits = Limits(max_message_bytes=len(msgpack.packb(header())) + len(WINDOW_BYTES))
    assert decode_request(frames_of(header(), WINDOW_BYTES), limits).id == 7


def test_oversized_header_is_too_large_before_it_is_parsed():
    frames = frames_of(header(note="n" * 900), WINDOW_BYTES)
    with pytest.raises(ProtocolError) as info:
        decode_request(frames, Limits(max_header_bytes=512))
    assert info.value.code == ErrorCode.TOO_LARGE


def test_deeply_nested_header_is_malformed_not_a_crash():
    packed = b"\x91" * 2000 + b"\x00"  # [[[...[0]...]]], 2000 one-element arrays deep
    with pytest.raises(ProtocolError) as info:
        decode_request([packed], Limits(max_header_bytes=4096))
    assert info.value.code == ErrorCode.MALFORMED


def test_unknown_header_fields_are_kept_as_op_fields():
    req = decode_request(frames_of(header(op="reset", arrays=[], scope="all")))
    assert req.fields == {"scope": "all"}


# --------------------------------------------------------------------------- replies


def test_reply_round_trip_converts_numpy_values():
    logits = np.array([0.25, -1.5], dtype=np.float32)
    frames = encode_reply(5, {"logits": logits, "label": np.int64(1), "timings": {}})
    assert len(frames) == 1
    raw = msgpack.unpackb(frames[0])
    assert raw == {
        "v": 1,
        "id": 5,
        "ok": True,
        "result": {"logits": [0.25, -1.5], "label": 1, "timings": {}},
    }
    reply = decode_reply(frames)
    assert reply.ok and reply.id == 5 and reply.error is None
    assert reply.result["logits"] == [0.25, -1.5]


@pytest.mark.parametrize(
    "error",
    [
        ProtocolError(ErrorCode.BUSY, "queue full"),
        ErrorInfo("busy", "queue full"),
        {"code": ErrorCode.BUSY, "message": "queue full"},
        ("busy", "queue full"),
    ],
)
def test_error_reply_round_trip(error):
    frames = encode_reply(None, error=error)
    assert msgpack.unpackb(frames[0]) == {
        "v": 1,
        "id": None,
        "ok": False,
        "error": {"code": "busy", "message": "queue full"},
    }
    reply = decode_reply(frames)
    assert not reply.ok and reply.id is None
    assert reply.error == ErrorInfo("busy", "queue full")


def test_reply_cannot_carry_both_result_and_error():
    with pytest.raises(ValueError):
        encode_reply(1, {"a": 1}, error=("busy", "x"))


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"\xc1", ErrorCode.MALFORMED),
        (msgpack.packb([1]), ErrorCode.MALFORMED),
        (msgpack.packb({"id": 1, "ok": True, "result": {}}), ErrorCode.MALFORMED),
        (msgpack.packb({"v": 2, "id": 1, "ok": True, "result": {}}), "unsupported-version"),
        (msgpack.packb({"v": 1, "id": "1", "ok": True, "result": {}}), ErrorCode.MALFORMED),
        (msgpack.packb({"v": 1, "id": 1, "ok": 1, "result": {}}), ErrorCode.MALFORMED),
        (msgpack.packb({"v": 1, "id": 1, "ok": True, "result": [1]}), ErrorCode.MALFORMED),
        (msgpack.packb({"v": 1, "id": 1, "ok": False}), ErrorCode.MALFORMED),
        (msgpack.packb({"v": 1, "id": 1, "ok": False, "error": {"code": 3}}), "malformed"),
    ],
)
def test_malformed_replies(raw, code):
    with pytest.raises(ProtocolError) as info:
        decode_reply([raw])
    assert info.value.code == code


# --------------------------------------------------------------------------- payload checks


def test_check_window_accepts_a_matching_finite_window():
    check_window(np.zeros((3, 150, 33, 1), np.float32), (3, 150, 33, 1))
    check_window(np.zeros((3, 150, 33, 2), np.float16), [3, 150, 33, 2])


def test_check_window_names_the_expected_shape():
    with pytest.raises(ProtocolError) as info:
        check_window(np.zeros((3, 100, 33, 1), np.float32), (3, 150, 33, 1))
    assert info.value.code == ErrorCode.BAD_SHAPE
    assert "(3, 150, 33, 1)" in info.value.message and "(3, 100, 33, 1)" in info.value.message


def test_check_window_finds_the_first_non_finite_value():
    window = np.zeros((3, 10, 5, 1), np.float16)
    window[1, 4, 2, 0] = np.inf
    window[2, 6, 0, 0] = np.nan
    with pytest.raises(ProtocolError) as info:
        check_window(window, (3, 10, 5, 1))
    assert info.value.code == ErrorCode.NON_FINITE
    assert "2 NaN/Inf" in info.value.message
    assert "channel 1, frame 4, keypoint 2, person 0" in info.value.message


def test_check_window_rejects_other_dtypes():
    with pytest.raises(ProtocolError) as info:
        check_window(np.zeros((3, 2, 2, 1), np.float64), (3, 2, 2, 1))
    assert info.value.code == ErrorCode.BAD_DTYPE


def test_check_frame_takes_frame_or_window_shape():
    frame = np.zeros((3, 33, 2), np.float32)
    check_frame(frame, (3, 33, 2))
    check_frame(frame, (3, 150, 33, 2))
    with pytest.raises(ProtocolError) as info:
        check_frame(np.zeros((3, 33, 1), np.float32), (3, 150, 33, 2))
    assert info.value.code == ErrorCode.BAD_SHAPE
    assert "(3, 33, 2)" in info.value.message
    frame[0, 3, 1] = np.nan
    with pytest.raises(ProtocolError) as info:
        check_frame(frame, (3, 33, 2))
    assert info.value.code == ErrorCode.NON_FINITE
    assert "keypoint 3, person 1" in info.value.message
