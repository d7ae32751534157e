"""The client's half of wire protocol v1 (protocol.py is the shared codec): requests
encoded, replies decoded."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from .protocol import (
    COMMON_REQUEST_KEYS,
    DTYPES,
    ENCODER,
    PROTOCOL_VERSION,
    ErrorCode,
    ErrorInfo,
    Op,
    ProtocolError,
    ReplyHeader,
    _as_bytes_view,
    _enum_value,
)


@dataclass(frozen=True)
class Reply:
    id: int | None
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: ErrorInfo | None = None
    version: int = PROTOCOL_VERSION


def encode_request(op: Op | str, req_id: int, camera: str, model: str | None = None,
                   arrays: Iterable[np.ndarray] = (), timeout_ms: float | None = None,
                   **fields: Any) -> list[bytes]:
    """Build the frames of one request: [header, *array bytes] (no identity frame)."""
    clash = COMMON_REQUEST_KEYS.intersection(fields)
    if clash:
        raise ValueError(f"op fields {sorted(clash)} clash with the common request header keys")
    wire_arrays = [_to_wire(a) for a in arrays]
    header: dict[str, Any] = {
        "v": PROTOCOL_VERSION, "op": _enum_value(op), "id": int(req_id), "camera": camera,
        "model": model, "timeout_ms": None if timeout_ms is None else float(timeout_ms),
        "arrays": [{"dtype": name, "shape": list(a.shape)} for name, a in wire_arrays]}
    header.update(fields)
    return [ENCODER.encode(header)] + [a.tobytes() for _, a in wire_arrays]


# The client trusts its daemon more than the daemon trusts clients: a reply is decoded in one
# call into the Struct the daemon encodes it from (protocol.ReplyHeader).
_REPLY_DECODER = msgspec.msgpack.Decoder(ReplyHeader)
_ANY_DECODER = msgspec.msgpack.Decoder()
# What the decoder's error path names -> what the reply lacked.
_REPLY_FAULTS = {
    "v": 'reply header lacks an integer "v"',
    "id": 'reply "id" must be an integer or nil',
    "ok": 'reply lacks a boolean "ok"',
    "result": 'reply "result" must be a map',
    "error": 'error reply needs "error": {"code": str, "message": str}',
}


def decode_reply(frames: Sequence[Any]) -> Reply:
    """Decode a reply's frames (as a DEALER receives them). Raises `ProtocolError`."""
    if not frames:
        raise ProtocolError(ErrorCode.MALFORMED, "empty reply")
    buf = _as_bytes_view(frames[0])
    try:
        header = _REPLY_DECODER.decode(buf)
    except Exception as exc:
        raise _refused(buf, exc) from None
    if header.v != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"server replied with protocol "
                            f"version {header.v}; this client speaks {PROTOCOL_VERSION}")
    if header.ok:
        result = header.result
        return Reply(id=header.id, ok=True, result={} if result is msgspec.UNSET else result,
                     version=header.v)
    error = header.error
    if error is msgspec.UNSET:
        raise ProtocolError(ErrorCode.MALFORMED, _REPLY_FAULTS["error"], header.id)
    # Optional keys of a v1 error map; of another type (a newer server's?) they are left out.
    reason, appended = error.reason, error.appended
    info = ErrorInfo(code=error.code, message=error.message,
                     reason=reason if isinstance(reason, str) else None,
                     appended=appended if isinstance(appended, bool) else None)
    return Reply(id=header.id, ok=False, error=info, version=header.v)


def _refused(buf: memoryview, exc: Exception) -> ProtocolError:
    """The error for a reply the Struct refused: a version this client does not speak first
    (whatever else a newer server's reply holds), else the key the decoder's error names."""
    if not isinstance(exc, msgspec.ValidationError):
        return ProtocolError(ErrorCode.MALFORMED, f"reply header is not msgpack: {exc}")
    try:
        raw = _ANY_DECODER.decode(buf)
    except Exception:  # a nesting deeper than msgspec follows
        raw = None
    if not isinstance(raw, dict):
        return ProtocolError(ErrorCode.MALFORMED, "reply header is not a map")
    version, req_id = raw.get("v"), raw.get("id")
    if type(version) is int and version != PROTOCOL_VERSION:
        return ProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"server replied with protocol "
                             f"version {version}; this client speaks {PROTOCOL_VERSION}")
    text = str(exc)
    key = next((k for k in _REPLY_FAULTS if f"`$.{k}" in text or f"`{k}`" in text), "v")
    if key in ("v", "id") or type(req_id) is not int:
        req_id = None
    return ProtocolError(ErrorCode.MALFORMED, _REPLY_FAULTS[key], req_id)


def _to_wire(array: Any) -> tuple[str, np.ndarray]:
    arr = np.asarray(array)
    for name, dtype in DTYPES.items():
        if arr.dtype.kind == dtype.kind and arr.dtype.itemsize == dtype.itemsize:
            # Fixes byte order and memory layout in one copy at most.
            return name, np.ascontiguousarray(arr, dtype=dtype)
    raise ProtocolError(ErrorCode.BAD_DTYPE, f"arrays travel as float32 or float16, got "
                        f"{arr.dtype.name}; convert with .astype(numpy.float32)")
