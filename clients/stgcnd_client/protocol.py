"""Wire protocol v1 between stgcnd and its clients: the single source of truth for both sides.

Frame 0 is a msgpack header, frames 1..n raw little-endian arrays described by
``header["arrays"]`` (docs/protocol.md). The headers are msgspec Structs (`RequestHeader`,
`ReplyHeader`): their types and limits are declared there once, and a request's problems are
the decoder's errors mapped to error codes. Pure (no sockets, no clocks), so daemon, client and
tests share it. The client's half (requests encoded, replies decoded) is wire.py, on top of
this module: the daemon never loads it.
"""

# msgspec evaluates the Structs' annotations at run time: on Python 3.8 they must be written
# Optional[...] and List[...], not `X | None` and `list[...]`.
# ruff: noqa: UP006, UP007, UP045
from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Dict, List, Literal, Optional, Union

import msgspec
import numpy as np
from msgspec import UNSET, Meta, Struct, UnsetType

from .header_scan import Bounds, bounded_type, problem, read_id

if sys.version_info >= (3, 9):
    from typing import Annotated  # novermin (3.8 takes it below)
else:  # pragma: no cover - Python 3.8
    from typing_extensions import Annotated

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
    TOO_OFTEN = "too-often"              # busy: sooner than the model's min_interval_ms
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


# Bounds every header is held to (docs/protocol.md §2, "Limits"), declared in the Structs below.
MAX_STR_LEN = 1024     # characters of any string in a header (at most 4 bytes each)
MAX_LIST_LEN = 64      # items of any list
MAX_MAP_LEN = 64       # entries of any map
MAX_ARRAYS = 4         # arrays per request
MAX_NDIM = 8           # dimensions per array
MAX_CAMERA_LEN = 128   # characters of a camera id
# Containers nested in a header, its own map the first: a request nests four deep
# ({"arrays": [{"shape": [...]}]}). The bound lets msgspec check every limit in C
# (header_scan.bounded_type, whose size doubles per level); msgpack-c allows 1024.
MAX_DEPTH = 8


@dataclass(frozen=True)
class Limits:
    """Bounds the decoder enforces so one hostile message cannot make the daemon allocate much.
    The sizes of a message vary per daemon (`[server] max_message_bytes`); what a header may
    hold is the protocol's, declared in the Structs (class attributes here, for reading)."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_header_bytes: int = 16 * 1024
    max_str_len: ClassVar[int] = MAX_STR_LEN
    # Headers carry no binary blobs; arrays travel as their own frames.
    max_bin_len: ClassVar[int] = 0
    max_array_len: ClassVar[int] = MAX_LIST_LEN
    max_map_len: ClassVar[int] = MAX_MAP_LEN
    max_arrays: ClassVar[int] = MAX_ARRAYS
    max_ndim: ClassVar[int] = MAX_NDIM
    max_camera_len: ClassVar[int] = MAX_CAMERA_LEN
    max_depth: ClassVar[int] = MAX_DEPTH


DEFAULT_LIMITS = Limits()
_BOUNDS = Bounds(MAX_STR_LEN, 0, MAX_LIST_LEN, MAX_MAP_LEN, MAX_DEPTH)


# --------------------------------------------------------------------------- the headers


class ArraySpec(Struct, forbid_unknown_fields=True):
    """One entry of a request's "arrays": the frame that follows, described."""

    dtype: Literal["float32", "float16"]
    shape: Annotated[List[Annotated[int, Meta(ge=0)]], Meta(max_length=MAX_NDIM)]


class RequestHeader(Struct, forbid_unknown_fields=True):
    """A request's header: its keys in the order they are checked (docs/protocol.md §3), then
    the op fields the daemon reads (`ts`, checked against the camera's clock later). A header
    with other keys decodes through the checked path (`_decode_in_order`) into `fields`."""

    v: Literal[1]
    id: int
    op: Literal["hello", "infer", "push", "reset", "ping", "stats"]
    camera: Annotated[str, Meta(min_length=1, max_length=MAX_CAMERA_LEN)]
    model: Optional[str] = None
    timeout_ms: Optional[Annotated[float, Meta(ge=0, le=sys.float_info.max)]] = None
    arrays: Annotated[List[ArraySpec], Meta(max_length=MAX_ARRAYS)] = []
    ts: Union[int, float, None] = None


class _OpenRequestHeader(RequestHeader, forbid_unknown_fields=False):
    """A request header whose other keys are skipped (they are the op's `fields`)."""


class ErrorMap(Struct):
    """A reply's error map: code and message, reason and appended where they apply (left
    out of the reply when unset; a reader takes a reason or appended of another type as
    none)."""

    code: str
    message: str = ""
    reason: Any = UNSET
    appended: Any = UNSET


class ReplyHeader(Struct, kw_only=True):
    """A reply's header: `id` always written (nil when the request had none), then `result`
    or `error`."""

    v: int
    id: Optional[int] = None
    ok: bool
    result: Union[Dict[Any, Any], UnsetType] = UNSET
    error: Union[ErrorMap, UnsetType] = UNSET


# A decoded value where a key's type fits but its value does not: that key's own code.
_VALUE_CODES: Mapping[str, tuple[Any, ErrorCode]] = {
    "v": (int, ErrorCode.UNSUPPORTED_VERSION),
    "op": (str, ErrorCode.UNKNOWN_OP),
    "dtype": (str, ErrorCode.BAD_DTYPE),
    "shape": (List[int], ErrorCode.BAD_SHAPE),
}


def _refusal(key: str, value: Any, index: int | None = None) -> tuple[ErrorCode, str]:
    """The code and message of a header key whose value the Struct refused."""
    loose, code = _VALUE_CODES.get(key, (None, ErrorCode.MALFORMED))
    if loose is not None:
        try:
            msgspec.convert(value, loose)
        except msgspec.ValidationError:
            code = ErrorCode.MALFORMED
    where = f"arrays[{index}]" if index is not None else ""
    if code == ErrorCode.UNSUPPORTED_VERSION:
        return code, (f"protocol version {value} is not supported; this server speaks "
                      f"{PROTOCOL_VERSION}")
    if code == ErrorCode.UNKNOWN_OP:
        return code, f"unknown op {value!r}; expected one of {sorted(OPS)}"
    if code == ErrorCode.BAD_DTYPE:
        return code, (f"{where}: dtype {value!r} is not supported; use one of {sorted(DTYPES)} "
                      "(little-endian)")
    if code == ErrorCode.BAD_SHAPE:
        return code, (f"{where}: shape {value} is not a valid array shape (at most {MAX_NDIM} "
                      "non-negative dimensions)")
    if key == "camera" and type(value) is str and value:
        return code, (f"camera id is {len(value)} characters; the limit is {MAX_CAMERA_LEN}")
    if key == "arrays" and type(value) is list:
        return code, f"{len(value)} arrays in one message; the limit is {MAX_ARRAYS}"
    if key == "timeout_ms":
        return code, f'"timeout_ms" must be a finite number >= 0 or nil, got {value!r}'
    return code, _MALFORMED[key].format(where=where)


_MALFORMED = {
    "v": 'header needs "v": the protocol version as an integer',
    "id": 'header needs "id": an integer request id',
    "op": 'header needs "op": a string naming the operation',
    "camera": 'header needs "camera": a non-empty string',
    "model": '"model" must be a string or nil (nil = default model)',
    "arrays": '"arrays" must be a list of {{"dtype", "shape"}} maps',
    "spec": '{where} must be a {{"dtype", "shape"}} map',
    "dtype": '{where} needs "dtype": a string',
    "shape": '{where} needs "shape": a list of integers',
}


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

_REQUEST_DECODER = msgspec.msgpack.Decoder(RequestHeader)
_BOUNDED_DECODER = msgspec.msgpack.Decoder(bounded_type(_BOUNDS))
_OPEN_REQUEST_DECODER = msgspec.msgpack.Decoder(_OpenRequestHeader)
# The common case's bound on a header's size. A Struct takes a repeated key once, so the map
# bound needs the bytes to hold it: the top map is a fixmap (checked: at most 15 entries), and
# an array description of more than 64 entries, each a "dtype" or "shape" key (6 bytes) and a
# value (1 at least), would need 455 bytes. Below this every string is within its bound too.
_FAST_MAX_BYTES = 64 * 7
# The Structs' fields in declaration order, for the checked path (read once: msgspec resolves
# the annotations each time it is asked).
_REQUEST_FIELDS = tuple(msgspec.structs.fields(RequestHeader))
_SPEC_FIELDS = tuple(msgspec.structs.fields(ArraySpec))


def decode_request(frames: Sequence[Any], limits: Limits | None = None) -> Request:
    """Validate and decode a request's frames (identity already stripped).

    Frames may be bytes, bytearray, memoryview or zmq.Frame. Raises `ProtocolError` with the code
    that names the first problem found (docs/protocol.md §3, "Order of the checks").
    """
    limits = limits or DEFAULT_LIMITS
    if not frames:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            "empty message; expected a msgpack header frame followed by one frame per array",
        )
    buffers = [_as_bytes_view(f) for f in frames]
    header_buf = buffers[0]
    size = header_buf.nbytes
    if size > limits.max_header_bytes:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"header frame is {size} bytes; the limit is {limits.max_header_bytes}",
            peek_id(header_buf, limits),
        )
    # The common case, one call: a header of the documented keys, small enough that the
    # bounds the Struct does not declare hold (_FAST_MAX_BYTES). Anything else
    # (another key, a limit, a wrong type or value) takes the checked path, which finds the
    # first problem in the documented order.
    header: RequestHeader | None = None
    if 0 < size <= _FAST_MAX_BYTES and 0x80 <= header_buf[0] <= 0x8F:
        try:
            header = _REQUEST_DECODER.decode(header_buf)
        except Exception:
            header = None
    if header is not None:
        req_id: int | None = header.id
        total = _check_frames(buffers, limits, req_id)
        fields: dict[str, Any] = {} if header.ts is None else {"ts": header.ts}
    else:
        header, fields, req_id, total = _decode_in_order(header_buf, buffers, limits)

    specs = header.arrays
    if len(specs) != len(buffers) - 1:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            f"header describes {len(specs)} array(s) but {len(buffers) - 1} array frame(s) "
            "followed it", req_id,
        )
    op = header.op
    expected_count = ARRAYS_PER_OP[op]
    if len(specs) != expected_count:
        raise ProtocolError(
            ErrorCode.MALFORMED,
            f"op {op!r} takes exactly {expected_count} array(s), got {len(specs)}", req_id,
        )

    arrays = []
    for index, spec in enumerate(specs):
        buf = buffers[index + 1]
        dtype = DTYPES[spec.dtype]
        shape = spec.shape
        expected_bytes = math.prod(shape) * dtype.itemsize
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

    return Request(op=op, id=header.id, camera=header.camera, model=header.model,
                   timeout_ms=header.timeout_ms, arrays=tuple(arrays), fields=fields,
                   version=header.v, nbytes=total)


def _check_frames(buffers: list[memoryview], limits: Limits, req_id: int | None) -> int:
    """The message's own bounds (step 1 of the order): its frames, then its bytes (returned)."""
    if len(buffers) > 1 + MAX_ARRAYS:
        raise ProtocolError(ErrorCode.TOO_LARGE, too_many_frames(limits), req_id)
    total = sum(b.nbytes for b in buffers)
    if total > limits.max_message_bytes:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"message is {total} bytes; the limit is {limits.max_message_bytes}", req_id,
        )
    return total


def _decode_in_order(header_buf: memoryview, buffers: list[memoryview], limits: Limits
                     ) -> tuple[RequestHeader, dict[str, Any], int | None, int]:
    """The checked path: the header's bounds, then each key converted to its Struct field's
    type in the documented order, a refusal mapped to the key's code. Keys the Struct does
    not name (and `ts`, whatever its type) are the op's `fields`."""
    refused: str | None = None
    try:
        raw = _BOUNDED_DECODER.decode(header_buf)
    except msgspec.ValidationError as exc:
        refused = problem(exc, _BOUNDS)
    except Exception as exc:
        # Not msgpack, cut short, trailing bytes; a str not UTF-8 (DecodeError, or on msgspec
        # 0.18 UnicodeDecodeError): the same to the peer.
        refused = str(exc)
    if refused is not None:
        raise ProtocolError(
            ErrorCode.MALFORMED, f"header is not a valid msgpack map within limits: {refused}",
            read_id(bytes(header_buf), _BOUNDS),
        )
    raw_id = raw.get("id")
    req_id = raw_id if type(raw_id) is int else None
    total = _check_frames(buffers, limits, req_id)
    fields = {k: v for k, v in raw.items() if k not in COMMON_REQUEST_KEYS}
    try:
        # A valid header with keys of its own (a client's tracing fields): one call in C;
        # its problems, if any, are found below in the documented order.
        return _OPEN_REQUEST_DECODER.decode(header_buf), fields, req_id, total
    except msgspec.ValidationError:
        pass
    values: dict[str, Any] = {}
    for spec in _REQUEST_FIELDS:
        key = spec.name
        if key == "ts":
            continue
        if key == "id" and req_id is None:
            raise ProtocolError(ErrorCode.MALFORMED, _MALFORMED["id"])
        # A field whose default is mutable ("arrays": []) has a factory instead.
        value = raw.get(key, spec.default if spec.default_factory is msgspec.NODEFAULT
                        else spec.default_factory())
        if key == "arrays":
            values[key] = _specs_in_order(value, req_id)
            continue
        try:
            values[key] = msgspec.convert(value, spec.type)
        except msgspec.ValidationError:
            raise ProtocolError(*_refusal(key, value), req_id) from None
    return RequestHeader(**values), fields, req_id, total


def _specs_in_order(value: Any, req_id: int | None) -> list[ArraySpec]:
    """"arrays": a list within its bound, then each description's keys in order (keys it
    does not name are ignored)."""
    if type(value) is not list or len(value) > MAX_ARRAYS:
        raise ProtocolError(*_refusal("arrays", value), req_id)
    specs = []
    for index, item in enumerate(value):
        if type(item) is not dict:
            raise ProtocolError(ErrorCode.MALFORMED,
                                _MALFORMED["spec"].format(where=f"arrays[{index}]"), req_id)
        converted = {}
        for spec in _SPEC_FIELDS:
            got = item.get(spec.name)
            try:
                converted[spec.name] = msgspec.convert(got, spec.type)
            except msgspec.ValidationError:
                raise ProtocolError(*_refusal(spec.name, got, index), req_id) from None
        specs.append(ArraySpec(**converted))
    return specs


def peek_id(header: Any, limits: Limits | None = None) -> int | None:
    """The request id of a header that may not decode as a whole: the int under "id" among
    the first `max_map_len` entries of the header's map, read one entry at a time; None when
    there is no such id. So that a reply carries the id whenever the request had one, also
    when the header breaks a limit (a string too long, too many entries, trailing bytes,
    non-string keys) or is too large. Values are skipped unread, so this allocates no more
    than the id itself, and reads no more entries than a valid header may have."""
    return read_id(bytes(_as_bytes_view(header)), _BOUNDS)


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
    if error is None:
        # A dict is sent as it is (the daemon builds a fresh one per reply); other mappings
        # are copied into one.
        header = ReplyHeader(v=PROTOCOL_VERSION, id=req_id, ok=True,
                             result=result if type(result) is dict else dict(result or {}))
    else:
        header = ReplyHeader(v=PROTOCOL_VERSION, id=req_id, ok=False, error=_error_map(error))
    return [ENCODER.encode(header)]


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


def _encode_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send {type(obj).__name__} in a message header")


# One encoder for every header, kept (msgspec's encoders are thread-safe and reuse their
# buffer). Enums go as their values; numpy scalars and arrays as plain numbers and lists.
ENCODER = msgspec.msgpack.Encoder(enc_hook=_encode_default)


def _check_dimensions(
    index: int, shape: list[int], dtype: np.dtype, limits: Limits, req_id: int | None
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


def _error_map(error: Any) -> ErrorMap:
    """The reply's error map: code and message, then reason and appended where given."""
    if isinstance(error, (ProtocolError, ErrorInfo)):
        return ErrorMap(str(_enum_value(error.code)), error.message,
                        UNSET if error.reason is None else str(_enum_value(error.reason)),
                        UNSET if error.appended is None else error.appended)
    if isinstance(error, Mapping):
        return ErrorMap(str(_enum_value(error["code"])), str(error.get("message", "")),
                        error.get("reason", UNSET), error.get("appended", UNSET))
    code, message = error
    return ErrorMap(str(_enum_value(code)), str(message))
