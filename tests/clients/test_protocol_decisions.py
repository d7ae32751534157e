"""docs/protocol.md's answers to issue #32's item 8, at the codec (stgcnd_client.protocol):
the id a reply echoes after a header-level failure, the error map's `reason` and `appended`,
numbers other packers write, and which check answers first. The daemon's side of the same
answers is tests/server/test_protocol_daemon.py."""

from __future__ import annotations

import msgpack
import pytest

from stgcnd_client.protocol import (
    ErrorCode,
    ProtocolError,
    decode_request,
    peek_id,
)

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


