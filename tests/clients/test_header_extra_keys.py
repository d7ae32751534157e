"""Valid request headers with keys the protocol does not name (docs/protocol.md §2: "Keys not
described here are ignored"), every msgpack type a key's value can have, "arrays" absent and
present: each decodes, the documented keys as sent, the others in `fields` as msgpack-python
decodes them (what the codec on msgpack-python returned: the oracle). A header the common
case's Struct refuses takes the checked path, which once refused every such header without
"arrays"; the limits on the extra keys' values hold at their bounds, and one past them."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from stgcnd_client.protocol import (
    COMMON_REQUEST_KEYS,
    MAX_DEPTH,
    ErrorCode,
    ProtocolError,
    decode_request,
)

EXTRA_VALUES = {
    "nil": None, "true": True, "false": False, "zero": 0, "int": 7, "negative": -3,
    "uint64": 2**64 - 1, "int64": -(2**63), "float": 1.5, "str": "x", "empty str": "",
    "unicode": "kamera-ä-😀", "str 1024 chars": "x" * 1024,
    "str 1024 chars of 4 bytes": "😀" * 1024,
    "str 300 chars": "é" * 300, "list": [1, 2], "empty list": [], "list 64": list(range(64)),
    "nested list": [[1, [2, ["three"]]]], "map": {"a": 1}, "empty map": {},
    "map 60": {str(i): i for i in range(60)}, "mixed": {"a": [None, 1.0, {"b": "c"}]},
    "deep": None,
}


def _nest(depth: int) -> object:
    """A value whose containers nest `depth` deep (the header's map adds one)."""
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


EXTRA_VALUES["deep"] = _nest(MAX_DEPTH - 1)
WINDOW = np.zeros((3, 4, 5, 1), np.float32)


def _header(extra: dict[str, object], op: str, arrays: bool | None) -> dict[str, object]:
    header: dict[str, object] = {"v": 1, "id": 5, "op": op, "camera": "c", **extra}
    if arrays is True:
        header["arrays"] = [{"dtype": "float32", "shape": list(WINDOW.shape)}]
    elif arrays is False:
        header["arrays"] = []
    return header


CASES = [
    pytest.param(op, arrays, {"k": value}, id=f"{op}-arrays {arrays}-{name}")
    for name, value in EXTRA_VALUES.items()
    for op, arrays in (("ping", None), ("ping", False), ("infer", True), ("push", True))
] + [
    pytest.param("ping", None, {"k": [1, 2]}, id="the issue's header"),
    pytest.param("push", True, {"ts": 12.5, "trace": {"span": "ab"}}, id="ts and a trace"),
    pytest.param("ping", None, {"model": None, "timeout_ms": None, "ts": None, "a": 1,
                                "b": "two"}, id="optional keys nil, extras"),
    pytest.param("ping", None, {str(i): i for i in range(60)}, id="64 entries"),
]


@pytest.mark.parametrize(("op", "arrays", "extra"), CASES)
def test_a_valid_header_with_extra_keys_decodes_as_msgpack_python_reads_it(op, arrays, extra):
    packed = msgpack.packb(_header(extra, op, arrays))
    frames = [packed, WINDOW.tobytes()] if arrays else [packed]
    request = decode_request(frames)
    oracle = msgpack.unpackb(packed, raw=False, strict_map_key=True, max_str_len=4096,
                             max_bin_len=0, max_array_len=64, max_map_len=64, max_ext_len=0)
    assert (request.op, request.id, request.camera) == (op, 5, "c")
    assert request.model is None and request.timeout_ms is None
    assert request.fields == {k: v for k, v in oracle.items() if k not in COMMON_REQUEST_KEYS}
    assert len(request.arrays) == (1 if arrays else 0)


@pytest.mark.parametrize(("value", "says"), [
    ("x" * 1025, "a string of more than 1024 characters"),
    ("😀" * 1025, "a string of more than 1024 characters"),
    (list(range(65)), "a list of more than 64 items"),
    ([[1] * 65], "a list of more than 64 items"),
    ({str(i): i for i in range(65)}, "a map of more than 64 entries"),
    (_nest(MAX_DEPTH), f"more than {MAX_DEPTH} deep"),
    ([_nest(5), "é" * 1025], "a string of more than 1024 characters"),
    (b"x", "bin"),
    (b"", "bin"),
    (msgpack.ExtType(1, b""), "ext"),
    ("deep", f"more than {MAX_DEPTH} deep"),
])
def test_an_extra_key_past_a_limit_is_malformed_with_its_id(value, says):
    header = msgpack.packb(_header({"k": 0}, "ping", None))
    if value == "deep":  # deeper than msgpack-python packs: the same header's bytes
        header = header[:-1] + b"\x91" * 3000 + b"\xc0"
    else:
        header = msgpack.packb(_header({"k": value}, "ping", None))
    with pytest.raises(ProtocolError) as info:
        decode_request([header])
    assert info.value.code == ErrorCode.MALFORMED
    assert info.value.req_id == 5
    assert says in info.value.message


def test_an_array_description_with_a_key_of_its_own_decodes():
    header = _header({"trace": "t"}, "infer", True)
    header["arrays"][0]["note"] = [1, "two"]  # type: ignore[index]
    request = decode_request([msgpack.packb(header), WINDOW.tobytes()])
    assert request.arrays[0].shape == WINDOW.shape and request.fields == {"trace": "t"}
