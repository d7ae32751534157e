"""The client's half of wire protocol v1 (protocol.py is the shared codec): requests
encoded, replies decoded."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from .protocol import (
    COMMON_REQUEST_KEYS,
    DTYPES,
    PROTOCOL_VERSION,
    ErrorCode,
    ErrorInfo,
    Op,
    ProtocolError,
    _as_bytes_view,
    _enum_value,
    _is_int,
    _pack,
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
    return [_pack(header)] + [a.tobytes() for _, a in wire_arrays]


def decode_reply(frames: Sequence[Any]) -> Reply:
    """Decode a reply's frames (as a DEALER receives them). Raises `ProtocolError`."""
    if not frames:
        raise ProtocolError(ErrorCode.MALFORMED, "empty reply")
    try:
        # The client trusts its daemon more than the daemon trusts clients, but a reply is still
        # bounded: v1 replies are small maps.
        header = msgpack.unpackb(_as_bytes_view(frames[0]), raw=False, strict_map_key=False,
                                 max_ext_len=0)
    except Exception as exc:
        raise ProtocolError(ErrorCode.MALFORMED, f"reply header is not msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(ErrorCode.MALFORMED, "reply header is not a map")
    version = header.get("v")
    if not _is_int(version):
        raise ProtocolError(ErrorCode.MALFORMED, 'reply header lacks an integer "v"')
    if version != PROTOCOL_VERSION:
        raise ProtocolError(ErrorCode.UNSUPPORTED_VERSION, f"server replied with protocol "
                            f"version {version}; this client speaks {PROTOCOL_VERSION}")
    req_id = header.get("id")
    if req_id is not None and not _is_int(req_id):
        raise ProtocolError(ErrorCode.MALFORMED, 'reply "id" must be an integer or nil')
    ok = header.get("ok")
    if not isinstance(ok, bool):
        raise ProtocolError(ErrorCode.MALFORMED, 'reply lacks a boolean "ok"', req_id)
    if ok:
        result = header.get("result", {})
        if not isinstance(result, dict):
            raise ProtocolError(ErrorCode.MALFORMED, 'reply "result" must be a map', req_id)
        return Reply(id=req_id, ok=True, result=result, version=version)
    error = header.get("error")
    if (not isinstance(error, dict) or not isinstance(error.get("code"), str)
            or not isinstance(error.get("message", ""), str)):
        raise ProtocolError(ErrorCode.MALFORMED,
                            'error reply needs "error": {"code": str, "message": str}', req_id)
    # Optional keys of a v1 error map; of another type (a newer server's?) they are left out.
    reason, appended = error.get("reason"), error.get("appended")
    info = ErrorInfo(code=error["code"], message=error.get("message", ""),
                     reason=reason if isinstance(reason, str) else None,
                     appended=appended if isinstance(appended, bool) else None)
    return Reply(id=req_id, ok=False, error=info, version=version)


def _to_wire(array: Any) -> tuple[str, np.ndarray]:
    arr = np.asarray(array)
    for name, dtype in DTYPES.items():
        if arr.dtype.kind == dtype.kind and arr.dtype.itemsize == dtype.itemsize:
            # Fixes byte order and memory layout in one copy at most.
            return name, np.ascontiguousarray(arr, dtype=dtype)
    raise ProtocolError(ErrorCode.BAD_DTYPE, f"arrays travel as float32 or float16, got "
                        f"{arr.dtype.name}; convert with .astype(numpy.float32)")
