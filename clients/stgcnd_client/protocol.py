"""Wire protocol v1 between stgcnd and its clients: the single source of truth for both sides.

Frame 0 is a msgpack header, frames 1..n raw little-endian arrays described by
``header["arrays"]`` (docs/protocol.md). Pure (no sockets, no clocks), so daemon, client and
tests share it. The client's half (requests encoded, replies decoded) is wire.py, reachable
from here too: the daemon never loads it.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

# A window (3, 150, 33, M) float32 is 59,400 bytes per person; 4 MiB leaves room for long
# windows of many people while still bounding what one hostile message can make us allocate.
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class ErrorCode(str, Enum):
    """Stable error codes carried in ``reply["error"]["code"]``; clients may switch on them."""

    MALFORMED = "malformed"
    UNSUPPORTED_VERSION = "unsupported-version"
    UNKNOWN_OP = "unknown-op"
    UNKNOWN_MODEL = "unknown-model"
    BAD_SHAPE = "bad-shape"
    BAD_DTYPE = "bad-dtype"
    BAD_SIZE = "bad-size"
    NON_FINITE = "non-finite"
    TOO_LARGE = "too-large"
    BUSY = "busy"
    EXPIRED = "expired"
    SHUTTING_DOWN = "shutting-down"
    INTERNAL = "internal"
    FORBIDDEN = "forbidden"

    def __str__(self) -> str:
        return self.value


class Op(str, Enum):
    """Operations a request may name in ``header["op"]``."""

    HELLO = "hello"
    INFER = "infer"
    PUSH = "push"
    RESET = "reset"
    PING = "ping"
    STATS = "stats"

    def __str__(self) -> str:
        return self.value


# Keyed by plain strings: a str-valued Enum hashes by member name, so Op keys would not match
# the strings that come off the wire.
OPS: frozenset[str] = frozenset(op.value for op in Op)
ARRAYS_PER_OP: Mapping[str, int] = {
    Op.HELLO.value: 0,
    Op.INFER.value: 1,
    Op.PUSH.value: 1,
    Op.RESET.value: 0,
    Op.PING.value: 0,
    Op.STATS.value: 0,
}

# Wire dtype names -> numpy dtypes. The byte order is fixed to little-endian on the wire.
DTYPES: Mapping[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
}

# Header keys every request has; everything else in a request header is an op-specific field.
COMMON_REQUEST_KEYS: frozenset[str] = frozenset(
    {"v", "op", "id", "camera", "model", "timeout_ms", "arrays"}
)


class Reason(str, Enum):
    """Why a `busy` or `shutting-down` request was refused (the error map's ``reason``), for
    clients that back off differently: docs/protocol.md §4 (busy's: "The `busy` reply")."""

    QUEUE_FULL = "queue-full"            # busy
    NO_CAMERA_SLOT = "no-camera-slot"    # busy
    STOPPING = "stopping"                # shutting-down: the daemon is stopping
    MODEL_REPLACED = "model-replaced"    # shutting-down: a reload is replacing the model

    def __str__(self) -> str:
        return self.value


class ProtocolError(Exception):
    """A message does not follow the protocol. ``code`` is an `ErrorCode` value.

    ``req_id`` is the request id when the header got far enough to read one, so the daemon can
    echo it in the error reply; None when the message could not be decoded at all.
    ``reason`` (busy, shutting-down) and ``appended`` (push) go into the reply's error map.
    """

    def __init__(self, code: ErrorCode | str, message: str, req_id: int | None = None,
                 reason: Reason | None = None, appended: bool | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = ErrorCode(code)
        self.message = message
        self.req_id = req_id
        self.reason = reason
        self.appended = appended


@dataclass(frozen=True)
class Limits:
    """Bounds the decoder enforces so one hostile message cannot make the daemon allocate much."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_header_bytes: int = 16 * 1024
    max_str_len: int = 1024
    # Headers carry no binary blobs; arrays travel as their own frames.
    max_bin_len: int = 0
    max_array_len: int = 64
    max_map_len: int = 64
    max_arrays: int = 4
    max_ndim: int = 8
    max_camera_len: int = 128


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Request:
    """A decoded, validated request. ``arrays`` are read-only views on the received frames."""

    op: str
    id: int
    camera: str
    model: str | None
    timeout_ms: float | None
    arrays: tuple[np.ndarray, ...] = ()
    fields: dict[str, Any] = field(default_factory=dict)
    version: int = PROTOCOL_VERSION
    nbytes: int = 0


@dataclass(frozen=True)
class ErrorInfo:
    code: str
    message: str
    reason: str | None = None      # busy / shutting-down: a `Reason` value (or a newer one)
    appended: bool | None = None   # push: whether its frame is in the camera's window


# --------------------------------------------------------------------------- requests


def decode_request(frames: Sequence[Any], limits: Limits | None = None) -> Request:
    """Validate and decode a request's frames (identity already stripped).

    Frames may be bytes, bytearray, memoryview or zmq.Frame. Raises `ProtocolError` with the code
    that names the first problem found.
    """
    limits = limits or DEFAULT_LIMITS
    if not frames:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            "empty message; expected a msgpack header frame followed by one frame per array",
        )
    buffers = [_as_bytes_view(f) for f in frames]
    header_buf = buffers[0]
    if header_buf.nbytes > limits.max_header_bytes:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"header frame is {header_buf.nbytes} bytes; the limit is {limits.max_header_bytes}",
            peek_id(header_buf, limits),
        )
    header = _unpack(header_buf, limits)
    if not isinstance(header, dict):
        raise ProtocolError(ErrorCode.MALFORMED,
                            f"header must be a msgpack map, got {type(header).__name__}")
    # Every check runs on every request, on the daemon's I/O loop, so they are written for
    # the common case: what msgpack decodes is exactly int, float, str, list or dict (no
    # subclasses but bool), so `type(x) is int` is `_is_int` there, without a call.
    raw_id = header.get("id")
    req_id = raw_id if type(raw_id) is int else None

    if len(buffers) > 1 + limits.max_arrays:
        raise ProtocolError(ErrorCode.TOO_LARGE, too_many_frames(limits), req_id)
    total = 0
    for b in buffers:
        total += b.nbytes
    if total > limits.max_message_bytes:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"message is {total} bytes; the limit is {limits.max_message_bytes}", req_id,
        )

    version = header.get("v")
    if type(version) is not int:
        raise ProtocolError(
            ErrorCode.MALFORMED, 'header needs "v": the protocol version as an integer', req_id)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol version {version} is not supported; this server speaks {PROTOCOL_VERSION}",
            req_id,
        )
    if req_id is None:
        raise ProtocolError(ErrorCode.MALFORMED, 'header needs "id": an integer request id')

    op = header.get("op")
    if type(op) is not str or op not in OPS:
        if not isinstance(op, str):
            raise ProtocolError(
                ErrorCode.MALFORMED, 'header needs "op": a string naming the operation', req_id)
        raise ProtocolError(
            ErrorCode.UNKNOWN_OP, f"unknown op {op!r}; expected one of {sorted(OPS)}", req_id)

    camera = header.get("camera")
    if type(camera) is not str or not camera:
        raise ProtocolError(ErrorCode.MALFORMED, 'header needs "camera": a non-empty string',
                            req_id)
    if len(camera) > limits.max_camera_len:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            f"camera id is {len(camera)} characters; the limit is {limits.max_camera_len}",
            req_id,
        )

    model = header.get("model")
    if model is not None and type(model) is not str:
        raise ProtocolError(
            ErrorCode.MALFORMED, '"model" must be a string or nil (nil = default model)', req_id)

    timeout_ms = header.get("timeout_ms")
    if timeout_ms is not None:
        kind = type(timeout_ms)
        if not (kind is int or kind is float) or not (
            math.isfinite(timeout_ms) and timeout_ms >= 0
        ):
            raise ProtocolError(
                ErrorCode.MALFORMED,
                f'"timeout_ms" must be a finite number >= 0 or nil, got {timeout_ms!r}',
                req_id,
            )
        timeout_ms = float(timeout_ms)

    specs = _array_specs(header.get("arrays", []), limits, req_id)
    if len(specs) != len(buffers) - 1:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            f"header describes {len(specs)} array(s) but {len(buffers) - 1} array frame(s) "
            "followed it", req_id,
        )
    expected_count = ARRAYS_PER_OP[op]
    if len(specs) != expected_count:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            f"op {op!r} takes exactly {expected_count} array(s), got {len(specs)}", req_id,
        )

    arrays = []
    for index, (dtype, shape, expected_bytes) in enumerate(specs):
        buf = buffers[index + 1]
        if buf.nbytes != expected_bytes:
            raise ProtocolError(
                ErrorCode.BAD_SIZE,
                f"array {index}: shape {tuple(shape)} of {dtype.name} needs {expected_bytes} "
                f"bytes, the frame has {buf.nbytes}", req_id,
            )
        if not expected_bytes:
            # A frame that holds its shape's bytes bounds every dimension, unless one is 0.
            _check_dimensions(index, shape, dtype, limits, req_id)
        array = np.frombuffer(buf, dtype=dtype).reshape(shape)
        # Frames may be writable (bytearray); the daemon must never modify a client's data.
        array.flags.writeable = False
        arrays.append(array)

    fields = (
        {}
        if header.keys() <= COMMON_REQUEST_KEYS
        else {k: v for k, v in header.items() if k not in COMMON_REQUEST_KEYS}
    )
    return Request(op=op, id=req_id, camera=camera, model=model, timeout_ms=timeout_ms,
                   arrays=tuple(arrays), fields=fields, version=version, nbytes=total)


def peek_id(header: Any, limits: Limits | None = None) -> int | None:
    """The request id of a header that may not decode as a whole: the int under "id" among
    the first `max_map_len` entries of the header's map, read one entry at a time; None when
    there is no such id. So that a reply carries the id whenever the request had one, also
    when the header breaks a limit (a string too long, too many entries, trailing bytes,
    non-string keys) or is too large. Values are skipped unread, so this allocates no more
    than the id itself, and reads no more entries than a valid header may have."""
    limits = limits or DEFAULT_LIMITS
    unpacker = msgpack.Unpacker(
        raw=False, strict_map_key=False, max_str_len=limits.max_str_len, max_bin_len=0,
        max_array_len=limits.max_array_len, max_map_len=limits.max_map_len, max_ext_len=0,
        max_buffer_size=max(_as_bytes_view(header).nbytes, 1),
    )
    req_id = None
    try:
        unpacker.feed(_as_bytes_view(header))
        entries = unpacker.read_map_header()
        for _ in range(min(entries, limits.max_map_len)):
            if unpacker.unpack() != "id":
                unpacker.skip()
                continue
            value = unpacker.unpack()
            req_id = value if _is_int(value) else None  # the last "id" counts, as in a dict
    except Exception:
        # Whatever stops the reading (end of data, a limit, a value that is not msgpack),
        # the id read so far, if any, is the header's.
        pass
    return req_id


def too_many_frames(limits: Limits) -> str:
    """The error message for a request with more frames than a header and max_arrays."""
    return (f"a request has at most {1 + limits.max_arrays} frames (a header and up to "
            f"{limits.max_arrays} arrays); this one has more")


# --------------------------------------------------------------------------- replies


def encode_reply(
    req_id: int | None,
    result: Mapping[str, Any] | None = None,
    error: ProtocolError | ErrorInfo | Mapping[str, Any] | tuple[str, str] | None = None,
) -> list[bytes]:
    """Build the frames of one reply (no identity frame; the ROUTER prepends it).

    ``error`` may be a ProtocolError, an ErrorInfo, a {"code", "message"} map or a (code, message)
    pair. numpy scalars and arrays in ``result`` are sent as plain numbers and lists.
    """
    if result is not None and error is not None:
        raise ValueError("a reply carries either a result or an error, not both")
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": req_id}
    if error is None:
        header["ok"] = True
        # A dict is sent as it is (the daemon builds a fresh one per reply); other mappings
        # are copied into one for msgpack.
        header["result"] = result if type(result) is dict else dict(result or {})
    else:
        header["ok"] = False
        header["error"] = _error_map(error)
    return [_pack(header)]


# --------------------------------------------------------------------------- payload checks


def check_window(array: np.ndarray, expected_shape: Sequence[int]) -> None:
    """Raise ProtocolError unless ``array`` is a finite float window of ``expected_shape``.

    ``expected_shape`` is a model's input shape (3, T, V, M) without the batch axis.
    """
    _check_payload(array, tuple(expected_shape), "window", _WINDOW_AXES)


def check_frame(array: np.ndarray, expected_shape: Sequence[int]) -> None:
    """Raise ProtocolError unless ``array`` is a finite float frame (3, V, M).

    ``expected_shape`` may be the frame shape (3, V, M) or the model's window shape (3, T, V, M),
    from which the frame shape is derived.
    """
    shape = tuple(expected_shape)
    if len(shape) == 4:
        shape = (shape[0], shape[2], shape[3])
    _check_payload(array, shape, "frame", _FRAME_AXES)


_WINDOW_AXES = ("channel (x, y, visibility)", "frame", "keypoint", "person")
_FRAME_AXES = ("channel (x, y, visibility)", "keypoint", "person")


def _check_payload(
    array: np.ndarray, expected: tuple[int, ...], what: str, axes: tuple[str, ...]
) -> None:
    if array.dtype.kind != "f" or array.dtype.itemsize not in (2, 4):
        raise ProtocolError(ErrorCode.BAD_DTYPE,
                            f"{what} must be float32 or float16, got {array.dtype.name}")
    if tuple(array.shape) != expected:
        names = ", ".join(axes)
        raise ProtocolError(
            ErrorCode.BAD_SHAPE,
            f"expected a {what} of shape {expected} ({names}), got {tuple(array.shape)}",
        )
    if not _all_finite(array):
        bad = np.argwhere(~np.isfinite(array))
        where = ", ".join(f"{axis.split(' ')[0]} {i}" for axis, i in zip(axes, bad[0]))
        raise ProtocolError(
            ErrorCode.NON_FINITE,
            f"{what} has {len(bad)} NaN/Inf value(s), the first at {where}; "
            "send 0 for keypoints that were not detected",
        )


# --------------------------------------------------------------------------- helpers


def _all_finite(array: np.ndarray) -> bool:
    """Whether no value is NaN or infinite, as np.isfinite(array).all() says, faster: a
    float32 window costs one BLAS dot and no boolean array (x * 0 is 0 for every finite x and
    NaN for NaN and +-inf, so the dot with zeros is 0 exactly when all are finite, and cannot
    overflow; vdot, unlike dot, raises no floating-point warning for them), half the time. A
    float16 one is NaN or inf where its exponent bits are all set: integer work, a tenth of
    numpy's float16 isfinite."""
    dtype = array.dtype
    if dtype == _F32:
        return math.isfinite(np.vdot(array, _zeros(array.size)))
    if dtype == _F16:
        return not ((array.view(np.uint16) & 0x7C00) == 0x7C00).any()
    return bool(np.isfinite(array).all())


_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)


@functools.lru_cache(maxsize=8)  # the window and frame sizes of the models served
def _zeros(size: int) -> np.ndarray:
    return np.zeros(size, np.float32)


def _is_int(value: Any) -> bool:
    # msgpack booleans decode to bool, which Python counts as int; msgpack decodes integers
    # to exactly int, so the type test is enough for what comes off the wire.
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _enum_value(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _as_bytes_view(frame: Any) -> memoryview:
    # zmq.Frame, bytes, bytearray and memoryview all expose the buffer protocol. Anything else
    # (or a non-contiguous buffer) is the caller's malformed message, never a crash.
    try:
        view = memoryview(frame)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
    except (TypeError, ValueError):
        raise ProtocolError(
            ErrorCode.MALFORMED,
            f"a message frame must be a contiguous byte buffer, got {type(frame).__name__}",
        ) from None
    return view


def _msgpack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Enum):
        return obj.value
    raise TypeError(f"cannot send {type(obj).__name__} in a message header")


# One Packer per thread, kept: msgpack.packb makes (and allocates the buffer of) a new one per
# message. A Packer is not thread-safe, and its `default` runs Python code mid-message.
_packers = threading.local()


def _pack(obj: Any) -> bytes:
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True, default=_msgpack_default)
    return packer.pack(obj)  # a failed pack leaves the packer empty for the next message


def _unpack(buf: memoryview, limits: Limits) -> Any:
    try:
        return msgpack.unpackb(buf, raw=False, strict_map_key=True, max_str_len=limits.max_str_len,
                               max_bin_len=limits.max_bin_len, max_array_len=limits.max_array_len,
                               max_map_len=limits.max_map_len, max_ext_len=0)
    except Exception as exc:
        # msgpack raises several types (ValueError, FormatError, StackError, ExtraData, ...);
        # every one of them means the same thing to the peer.
        raise ProtocolError(
            ErrorCode.MALFORMED, f"header is not a valid msgpack map within limits: {exc}",
            peek_id(buf, limits),
        ) from None


def _array_specs(raw: Any, limits: Limits, req_id: int
                 ) -> list[tuple[np.dtype, list[int], int]]:
    """(dtype, shape, bytes it needs) of each array the header describes."""
    if type(raw) is not list:
        raise ProtocolError(
            ErrorCode.MALFORMED, '"arrays" must be a list of {"dtype", "shape"} maps', req_id)
    if len(raw) > limits.max_arrays:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            f"{len(raw)} arrays in one message; the limit is {limits.max_arrays}", req_id,
        )
    specs = []
    for index, spec in enumerate(raw):
        if type(spec) is not dict:
            raise ProtocolError(
                ErrorCode.MALFORMED, f'arrays[{index}] must be a {{"dtype", "shape"}} map', req_id)
        dtype_name = spec.get("dtype")
        shape = spec.get("shape")
        dtype = DTYPES.get(dtype_name) if type(dtype_name) is str else None
        if dtype is None:
            if not isinstance(dtype_name, str):
                raise ProtocolError(
                    ErrorCode.MALFORMED, f'arrays[{index}] needs "dtype": a string', req_id)
            raise ProtocolError(
                ErrorCode.BAD_DTYPE,
                f"arrays[{index}]: dtype {dtype_name!r} is not supported; use one of "
                f"{sorted(DTYPES)} (little-endian)", req_id,
            )
        if type(shape) is not list:
            raise ProtocolError(
                ErrorCode.MALFORMED, f'arrays[{index}] needs "shape": a list of integers', req_id)
        # One pass: every dimension an int (bool is not), none negative, and their product.
        elements = 1
        negative = False
        for d in shape:
            if type(d) is not int:
                raise ProtocolError(ErrorCode.MALFORMED,
                                    f'arrays[{index}] needs "shape": a list of integers', req_id)
            if d < 0:
                negative = True
            elements *= d
        if len(shape) > limits.max_ndim or negative:
            raise ProtocolError(
                ErrorCode.BAD_SHAPE,
                f"arrays[{index}]: shape {shape} is not a valid array shape "
                f"(at most {limits.max_ndim} non-negative dimensions)", req_id,
            )
        specs.append((dtype, shape, elements * dtype.itemsize))
    return specs


def _check_dimensions(
    index: int, shape: list[int], dtype: np.dtype, limits: Limits, req_id: int
) -> None:
    """Refuse shapes no array within the message limit can have, before numpy sees them.

    A frame whose length matches its shape already bounds a non-empty array, but an empty one
    (a zero dimension) matches a 0-byte frame whatever its other dimensions are: ``[2**63, 0]``
    or ``[2**32, 2**32, 0]`` would make numpy's reshape raise. No axis of a real array within
    the limit is longer than ``max_message_bytes / itemsize``, and neither is the product of the
    non-zero dimensions.
    """
    bound = limits.max_message_bytes // dtype.itemsize
    longest = max(shape, default=0)
    nonzero_product = math.prod(d for d in shape if d)
    if longest > bound or nonzero_product > bound:
        raise ProtocolError(
            ErrorCode.BAD_SHAPE,
            f"arrays[{index}]: shape {shape} is not a valid array shape: no dimension, and no "
            f"product of the non-zero dimensions, may exceed {bound} elements of "
            f"{dtype.name} (the {limits.max_message_bytes}-byte message limit)", req_id,
        )


def _error_map(error: Any) -> dict[str, Any]:
    """The reply's error map: code and message, then reason and appended where given."""
    if isinstance(error, (ProtocolError, ErrorInfo)):
        out: dict[str, Any] = {"code": str(_enum_value(error.code)), "message": error.message}
        if error.reason is not None:
            out["reason"] = str(_enum_value(error.reason))
        if error.appended is not None:
            out["appended"] = error.appended
        return out
    if isinstance(error, Mapping):
        return {**error, "code": str(_enum_value(error["code"])),
                "message": str(error.get("message", ""))}
    code, message = error
    return {"code": str(_enum_value(code)), "message": str(message)}


_CLIENT_HALF = frozenset({"Reply", "encode_request", "decode_reply"})


def __getattr__(name: str) -> Any:
    """The client's half, wire.py, imported when first asked for here (PEP 562)."""
    if name in _CLIENT_HALF:
        from . import wire

        return getattr(wire, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
