"""docs/protocol.md's byte-level examples are what the real encoder writes, so the doc cannot drift.

§8 gives examples as: a sentence ending in "N bytes:", the message as a msgpack literal in
backticks on the next line (JSON with `nil`), then a fenced block of hex bytes. Each one is
re-encoded here with stgcnd_client.protocol (requests with encode_request, replies with
encode_reply) and compared byte for byte, and every "N bytes" / "N-byte" claim of §8 is checked
against the bytes it describes. The rules §2 and §3 state about other packers (ints for floats)
are checked against the real decoder.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgpack
import numpy as np
import pytest

from stgcnd_client.protocol import DTYPES, ErrorCode, ProtocolError, decode_request, encode_reply
from stgcnd_client.wire import decode_reply, encode_request
from tests.conftest import REPO

DOC = REPO / "docs" / "protocol.md"
TEXT = DOC.read_text()

HEX_BLOCK = re.compile(r"^```[a-z]*\n((?:[0-9a-f]{2}(?: |\n))+)```", re.M)
# "... 64 bytes:\n`{...}`\n\n```\n<hex>```"
EXAMPLE = re.compile(
    r"(\d+) bytes:\n`(\{.*\})`\n\n```[a-z]*\n((?:[0-9a-f]{2}(?: |\n))+)```", re.M
)


def section(number: int) -> str:
    match = re.search(rf"^## {number}\. .*?(?=^## |\Z)", TEXT, re.M | re.S)
    assert match, f"docs/protocol.md has no section {number}"
    return match.group(0)


EXAMPLES_TEXT = section(8)


def flat(text: str) -> str:
    """Prose with its line breaks and runs of spaces made single spaces."""
    return " ".join(text.split())


def literal(text: str) -> Any:
    """The doc's msgpack literal: JSON with nil for msgpack nil."""
    return json.loads(re.sub(r"\bnil\b", "null", text))


def unhex(block: str) -> bytes:
    return bytes.fromhex(block.replace("\n", " "))


def encode(message: dict[str, Any]) -> list[bytes]:
    """The frames the real encoder makes for the message the doc shows."""
    if "op" in message:
        arrays = [np.zeros(spec["shape"], DTYPES[spec["dtype"]]) for spec in message["arrays"]]
        return encode_request(message["op"], message["id"], message["camera"], message["model"],
                              arrays, timeout_ms=message["timeout_ms"])
    if message["ok"]:
        return encode_reply(message["id"], message["result"])
    return encode_reply(message["id"], error=message["error"])


EXAMPLES = [(int(n), literal(lit), unhex(h)) for n, lit, h in EXAMPLE.findall(EXAMPLES_TEXT)]


def test_every_hex_dump_is_a_checked_example() -> None:
    dumps = HEX_BLOCK.findall(TEXT)
    assert len(EXAMPLES) >= 3  # ping, its reply, push
    assert len(dumps) == len(EXAMPLES), (
        "every hex dump in docs/protocol.md must follow an 'N bytes:' line and its message "
        "literal, so that this test checks it")


@pytest.mark.parametrize(("count", "message", "dump"), EXAMPLES,
                         ids=[m.get("op", "reply") for _, m, _ in EXAMPLES])
def test_example_bytes_match_the_encoder(count: int, message: dict[str, Any],
                                         dump: bytes) -> None:
    frames = encode(message)
    assert frames[0].hex(" ") == dump.hex(" ")
    assert len(dump) == count
    # The dump decodes to the literal it documents.
    assert msgpack.unpackb(dump, raw=False) == message
    if "op" in message:
        req = decode_request(frames)
        assert (req.op, req.id, req.camera, req.model) == (
            message["op"], message["id"], message["camera"], message["model"])
    else:
        assert decode_reply(frames).id == message["id"]


def push_example() -> tuple[dict[str, Any], list[bytes]]:
    message = next(m for _, m, _ in EXAMPLES if m.get("op") == "push")
    return message, encode(message)


def test_push_frame_sizes_match_the_text() -> None:
    message, frames = push_example()
    (spec,) = message["arrays"]
    nbytes = math.prod(spec["shape"]) * DTYPES[spec["dtype"]].itemsize
    assert len(frames) == 2 and len(frames[1]) == nbytes
    frame_line = re.search(r"Frame 1, the array, (\d+) bytes \((\d+) x (\d+) x (\d+) (\w+)\)",
                           flat(EXAMPLES_TEXT))
    assert frame_line, "the push example must state frame 1's size"
    stated, c, v, m, dtype = frame_line.groups()
    assert int(stated) == nbytes
    assert [int(c), int(v), int(m)] == spec["shape"] and dtype == spec["dtype"]


def test_push_header_variants_in_the_text() -> None:
    """'89 bytes for camera cam-1, one more from id 128, 84 bytes if 200.0 is packed as cc c8'."""
    message, frames = push_example()
    header = msgpack.unpackb(frames[0], raw=False)
    m = re.search(r"(\d+) bytes for camera `([^`]+)`, one more from id (\d+) \(`cc 80`\), and "
                  r"(\d+) bytes if `200\.0` is packed as `cc c8`", flat(EXAMPLES_TEXT))
    assert m, "the push example's variants sentence changed; update this test"
    other_camera_bytes, other_camera, first_two_byte_id, int_timeout_bytes = m.groups()
    assert len(encode({**message, "camera": other_camera})[0]) == int(other_camera_bytes)
    wide = encode({**message, "id": int(first_two_byte_id)})[0]
    assert len(wide) == len(frames[0]) + 1 and b"\xa2id\xcc\x80" in wide
    assert len(encode({**message, "id": int(first_two_byte_id) - 1})[0]) == len(frames[0])
    # A packer that writes the whole double 200.0 as uint8 200 (msgpack-c does).
    as_int = msgpack.packb({**header, "timeout_ms": 200})
    assert b"\xaatimeout_ms\xcc\xc8" in as_int and len(as_int) == int(int_timeout_bytes)
    req = decode_request([as_int, frames[1]])
    assert req.timeout_ms == 200.0 and isinstance(req.timeout_ms, float)


def test_sketch_sends_the_push_example() -> None:
    """The C++ sketch's values are the push example's (so its byte count holds for it)."""
    message, _ = push_example()
    sketch = re.search(r"```cpp\n(.*?)```", EXAMPLES_TEXT, re.S)
    assert sketch
    code = sketch.group(1)
    assert f'pk.pack("{message["op"]}")' in code
    assert f'pk.pack("{message["camera"]}")' in code
    assert f'pk.pack({message["timeout_ms"]})' in code
    assert "pk.pack_nil()" in code and message["model"] is None
    assert f"pk.pack_map({len(message)})" in code
    shape = ", ".join(map(str, message["arrays"][0]["shape"]))
    assert f"std::vector<int>{{{shape}}}" in code


def test_payload_sizes_in_section_3() -> None:
    """'A frame is ~400 bytes for one person (3 x 33 x 1 float32) against ~58 KB for a full
    150-frame window'."""
    m = re.search(r"~(\d+) bytes for one person \(3 x 33 x 1 float32\) against ~(\d+) KB for a "
                  r"full (\d+)-frame window", flat(section(3)))
    assert m
    frame, window_kb, frames = map(int, m.groups())
    one = 3 * 33 * 1 * 4
    assert abs(one - frame) <= 0.05 * frame
    assert round(one * frames / 1024) == window_kb


@pytest.mark.parametrize("missing", ["v", "id", "op", "camera"])
def test_required_keys(missing: str) -> None:
    header = msgpack.unpackb(encode_request("ping", 7, "cam")[0], raw=False)
    del header[missing]
    with pytest.raises(ProtocolError) as exc:
        decode_request([msgpack.packb(header)])
    assert exc.value.code == ErrorCode.MALFORMED


def test_optional_keys_and_timeout_rules() -> None:
    bare = {"v": 1, "op": "ping", "id": -5, "camera": "c"}
    req = decode_request([msgpack.packb(bare)])
    assert (req.model, req.timeout_ms, req.arrays, req.id) == (None, None, (), -5)
    assert decode_request([msgpack.packb({**bare, "timeout_ms": 0})]).timeout_ms == 0.0
    for bad in (-1, -0.5, float("nan"), float("inf"), True):
        with pytest.raises(ProtocolError) as exc:
            decode_request([msgpack.packb({**bare, "timeout_ms": bad})])
        assert exc.value.code == ErrorCode.MALFORMED
    with pytest.raises(ProtocolError) as exc:
        decode_request([msgpack.packb({**bare, "id": 1.0})])
    assert exc.value.code == ErrorCode.MALFORMED and exc.value.req_id is None
    assert decode_request([msgpack.packb({**bare, "id": 2**64 - 1})]).id == 2**64 - 1


def test_camera_id_limit_counts_characters() -> None:
    bare = {"v": 1, "op": "ping", "id": 1}
    assert decode_request([msgpack.packb({**bare, "camera": "\u00e9" * 128})]).camera
    with pytest.raises(ProtocolError) as exc:
        decode_request([msgpack.packb({**bare, "camera": "a" * 129})])
    assert exc.value.code == ErrorCode.MALFORMED and exc.value.req_id == 1
