"""Seeded generators of hostile protocol v1 requests, shared by the decoder fuzz test
(tests/clients/test_protocol_fuzz.py) and the daemon fuzz suite (tests/server/test_fuzz.py).

Pure: msgpack, numpy and `random` only; no sockets. Each generator returns `Case`s: the frames
to send (no identity frame) and what any conforming server must answer, as far as the protocol
fixes it. `expected_reply_id` is an oracle independent of `decode_request`: it unpacks the header
with the documented limits and reads an integer "id" from it (from a header that breaks them,
from the entries read before the break: docs/protocol.md, §3), or gives None.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack
import numpy as np

from stgcnd_client.protocol import Limits

# Codes a request can get for reasons that have nothing to do with its content.
LOAD_CODES = frozenset({"busy", "expired"})

OPS = ("hello", "infer", "push", "reset", "ping", "stats")


def random_bytes(rng: random.Random, n: int) -> bytes:
    """n random bytes (Random.randbytes needs Python 3.9; the tests run on 3.8 too)."""
    return bytes(rng.randrange(256) for _ in range(n))


@dataclass
class Case:
    kind: str                       # the generator that made it
    frames: list[bytes]
    note: str                       # short human description, shown on failure
    # Outcomes the protocol allows ("ok" or error codes); None: any stable code but internal.
    allowed: frozenset[str] | None = None
    reply_id: int | None = None     # filled by `finish`
    header: Any = field(default=None, repr=False)

    def describe(self, max_len: int = 300) -> str:
        head = repr(self.header) if self.header is not None else repr(self.frames[:1])[:120]
        sizes = [len(f) for f in self.frames]
        text = f"[{self.kind}] {self.note}; header={head}; frame sizes={sizes}"
        return text if len(text) <= max_len else text[:max_len] + "..."


def expected_reply_id(frames: list[bytes], limits: Limits) -> int | None:
    """The id a reply must carry (docs/protocol.md, §3): the header's integer id when the
    header decodes; when it does not (a limit broken, trailing bytes, cut short, too large),
    the last integer "id" among the entries of its map read before the damage, within the
    first max_map_len entries."""
    if not frames:
        return None
    if len(frames[0]) <= limits.max_header_bytes:
        try:
            header = msgpack.unpackb(
                frames[0], raw=False, strict_map_key=True, max_str_len=4 * limits.max_str_len,
                max_bin_len=limits.max_bin_len, max_array_len=limits.max_array_len,
                max_map_len=limits.max_map_len, max_ext_len=0)
        except Exception:
            pass
        else:
            if not isinstance(header, dict):
                return None
            if _within(header, limits):
                return _int_or_none(header.get("id"))
    return _id_before_the_damage(frames[0], limits)


def _within(header: dict[Any, Any], limits: Limits) -> bool:
    """The limits msgpack-python's cannot say: strings in characters, containers nested at
    most max_depth deep, no bin or ext at all (docs/protocol.md §2)."""
    depth, level = 0, [header]
    while True:
        containers = [item for item in level if isinstance(item, (dict, list))]
        if not containers:
            return True
        depth += 1
        if depth > limits.max_depth:
            return False
        level = [inner for item in containers
                 for inner in ([*item.keys(), *item.values()] if isinstance(item, dict)
                               else item)]
        if any(isinstance(item, (bytes, msgpack.ExtType)) or
               (isinstance(item, str) and len(item) > limits.max_str_len) for item in level):
            return False


def _id_before_the_damage(header: bytes, limits: Limits) -> int | None:
    stream = msgpack.Unpacker(raw=False, strict_map_key=False, max_str_len=limits.max_str_len,
                              max_bin_len=limits.max_bin_len, max_ext_len=0,
                              max_array_len=limits.max_array_len,
                              max_map_len=limits.max_map_len)
    stream.feed(header)
    found = None
    try:
        for _ in range(min(stream.read_map_header(), limits.max_map_len)):
            if stream.unpack() == "id":
                found = _int_or_none(stream.unpack())
            else:
                stream.skip()
    except Exception:
        pass
    return found


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Generator:
    """Makes cases for a model whose window is `window_shape` (3, T, V, M)."""

    def __init__(self, rng: random.Random, window_shape: tuple[int, ...], limits: Limits,
                 camera_prefix: str = "fz") -> None:
        self.rng = rng
        self.window_shape = tuple(window_shape)
        self.frame_shape = (window_shape[0], window_shape[2], window_shape[3])
        self.limits = limits
        self.prefix = camera_prefix
        self._next_id = 1_000_000
        self._np = np.random.default_rng(rng.getrandbits(32))
        self.kinds: dict[str, Callable[[], list[Case]]] = {
            "random-bytes": self.random_bytes,
            "garbage-msgpack": self.garbage_msgpack,
            "wrong-type": self.wrong_type,
            "shape": self.shape,
            "dtype": self.dtype,
            "frame-count": self.frame_count,
            "oversized": self.oversized,
            "values": self.values,
            "unknown-op-model": self.unknown_op_model,
            "camera-id": self.camera_id,
            "timeout": self.timeout,
            "push-sequence": self.push_sequence,
            "reset": self.reset,
            "valid": self.valid,
        }

    # -- helpers -------------------------------------------------------------------------
    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def camera(self) -> str:
        # A quarter of requests come from camera ids nobody used before: a client inventing
        # ids must not get around the daemon's limits (max_cameras, log rate limits).
        if self.rng.random() < 0.25:
            return f"{self.prefix}-inv-{self.rng.getrandbits(48):012x}"
        return f"{self.prefix}-{self.rng.randrange(8)}"

    def header(self, op: str = "ping", /, **changes: Any) -> dict[str, Any]:
        h: dict[str, Any] = {"v": 1, "op": op, "id": self.new_id(), "camera": self.camera(),
                             "model": None, "timeout_ms": None, "arrays": []}
        if op == "infer":
            h["arrays"] = [{"dtype": "float32", "shape": list(self.window_shape)}]
        elif op == "push":
            h["arrays"] = [{"dtype": "float32", "shape": list(self.frame_shape)}]
        h.update(changes)
        return h

    def payload(self, op: str, dtype: str = "float32") -> bytes:
        shape = self.window_shape if op == "infer" else self.frame_shape
        if op not in ("infer", "push"):
            return b""
        return self._np.random(shape).astype(dtype).tobytes()

    def case(self, kind: str, header: Any, arrays: list[bytes], note: str,
             allowed: frozenset[str] | None = None, packed: bytes | None = None) -> Case:
        head = packed if packed is not None else msgpack.packb(header, use_bin_type=True)
        c = Case(kind, [head, *arrays], note, allowed, header=header)
        c.reply_id = expected_reply_id(c.frames, self.limits)
        return c

    def valid_request(self, op: str | None = None, /, **changes: Any) -> tuple[dict, list[bytes]]:
        op = op or self.rng.choice(OPS)
        h = self.header(op, **changes)
        arrays = [self.payload(op)] if op in ("infer", "push") else []
        return h, arrays

    # A push sequence makes ~8 requests, each costing a real push: pick it less often.
    WEIGHTS: ClassVar[dict[str, float]] = {"push-sequence": 0.2}

    def make(self) -> list[Case]:
        kinds = list(self.kinds)
        kind = self.rng.choices(kinds, [self.WEIGHTS.get(k, 1.0) for k in kinds])[0]
        return self.kinds[kind]()

    def stream(self, count: int) -> Iterator[Case]:
        """At least `count` cases (a multi-request scenario is never cut short)."""
        made = 0
        while made < count:
            for c in self.make():
                made += 1
                yield c

    # -- generators ------------------------------------------------------------------------
    def random_bytes(self) -> list[Case]:
        n = self.rng.randrange(1, 4)
        frames = [random_bytes(self.rng, self.rng.choice((0, 1, 3, 17, 200, 2000)))
                  for _ in range(n)]
        c = Case("random-bytes", frames, f"{n} random frame(s)")
        c.reply_id = expected_reply_id(frames, self.limits)
        return [c]

    def garbage_msgpack(self) -> list[Case]:
        h, arrays = self.valid_request()
        packed = msgpack.packb(h)
        how = self.rng.choice(("truncate", "flip", "trailing", "array", "scalar", "deep",
                               "ext", "bin-key", "int-key", "empty"))
        if how == "truncate":
            packed = packed[:self.rng.randrange(len(packed))]
        elif how == "flip":
            b = bytearray(packed)
            for _ in range(self.rng.randrange(1, 4)):
                b[self.rng.randrange(len(b))] = self.rng.randrange(256)
            packed = bytes(b)
        elif how == "trailing":
            packed += self.rng.choice((b"\x00", b"\xc0", msgpack.packb({"v": 1})))
        elif how == "array":
            packed = msgpack.packb(list(h.items()))
        elif how == "scalar":
            packed = msgpack.packb(self.rng.choice((1, "ping", None, 2.5, True)))
        elif how == "deep":
            depth = self.rng.choice((10, 100, 2000))
            packed = b"\x81\xa1x" * depth + b"\x00"
        elif how == "ext":
            packed = msgpack.packb({**h, "x": msgpack.ExtType(5, b"abc")})
        elif how == "bin-key":
            packed = msgpack.packb({**h, b"bin": 1}, use_bin_type=True)
        elif how == "int-key":
            packed = msgpack.packb({**h, 3: 1}, strict_types=False)
        else:
            packed = b""
        return [self.case("garbage-msgpack", h, arrays, how, packed=packed)]

    WRONG_VALUES: tuple[Any, ...] = (
        None, True, False, 0, -1, 2, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, float("nan"),
        float("inf"), "", "x", "1", b"", b"\x00", [], [1], {}, {"a": 1}, [[[]]],
    )

    def wrong_type(self) -> list[Case]:
        op = self.rng.choice(OPS)
        h, arrays = self.valid_request(op)
        key = self.rng.choice(("v", "op", "id", "camera", "model", "timeout_ms", "arrays"))
        if self.rng.random() < 0.15:
            del h[key]
            note = f"{key} missing"
        else:
            h[key] = self.rng.choice(self.WRONG_VALUES)
            note = f"{key}={h[key]!r}"
        return [self.case("wrong-type", h, arrays, note)]

    def shape(self) -> list[Case]:
        op = self.rng.choice(("infer", "push"))
        good = list(self.window_shape if op == "infer" else self.frame_shape)
        choice = self.rng.choice((
            [2**63, 0], [0, 2**63], [2**32, 2**32, 0], [2**64 - 1, 0], [0] * 8, [0],
            [2**22] * 7 + [0], [], [1], [1] * 9, [-1, 3], [3, -5, 33, 1], [2**40, 2**40],
            good[:-1], [*good, 1], [g + 1 for g in good], [good[0], 0, *good[2:]],
            list(reversed(good)), [self.rng.randrange(-2, 2**20) for _ in range(len(good))],
        ))
        count = math.prod(choice) if all(isinstance(d, int) and d >= 0 for d in choice) else -1
        nbytes = count * 4 if 0 <= count * 4 <= 1 << 20 else self.rng.choice((0, 4, 400))
        if self.rng.random() < 0.3:
            nbytes = self.rng.choice((0, 4, 396))
        h = self.header(op, arrays=[{"dtype": "float32", "shape": choice}])
        payload = self._np.random(nbytes // 4).astype("<f4").tobytes() if nbytes > 0 else b""
        zero_dim = 0 in choice
        allowed = None
        if zero_dim and count == 0 and nbytes == 0 and choice != good:
            allowed = frozenset({"bad-shape"})
        return [self.case("shape", h, [payload], f"{op} shape {choice} with {nbytes} bytes",
                          allowed)]

    def dtype(self) -> list[Case]:
        op = self.rng.choice(("infer", "push"))
        name = self.rng.choice(("float64", "int8", "uint8", "", "FLOAT32", "<f4", "float32 ",
                                "float16", "bfloat16", "float32\x00", "f" * 200))
        shape = self.window_shape if op == "infer" else self.frame_shape
        item = {"float64": 8, "float16": 2, "int8": 1, "uint8": 1}.get(name, 4)
        h = self.header(op, arrays=[{"dtype": name, "shape": list(shape)}])
        data = bytes(math.prod(shape) * item)
        allowed = None if name == "float16" else frozenset({"bad-dtype"})
        return [self.case("dtype", h, [data], f"{op} dtype {name!r}", allowed)]

    def frame_count(self) -> list[Case]:
        op = self.rng.choice(OPS)
        h, arrays = self.valid_request(op)
        how = self.rng.choice(("extra-frame", "missing-frame", "extra-spec", "no-specs",
                               "five-arrays"))
        if how == "extra-frame":
            arrays = [*arrays, self.payload("push") or b"x"]
        elif how == "missing-frame":
            arrays = arrays[:-1] if arrays else []
            if op not in ("infer", "push"):
                h["arrays"] = [{"dtype": "float32", "shape": [1]}]
        elif how == "extra-spec":
            h["arrays"] = h["arrays"] + [{"dtype": "float32", "shape": [1]}]
            arrays = [*arrays, b"\x00\x00\x00\x00"]
        elif how == "no-specs":
            h["arrays"] = []
            if not arrays:
                arrays = [b"\0\0\0\0"]
        else:  # more frames than a request has: refused for its size before its header
            h["arrays"] = [{"dtype": "float32", "shape": [1]}] * 5
            arrays = [b"\0\0\0\0"] * 5
            return [self.case("frame-count", h, arrays, f"{op} {how}", frozenset({"too-large"}))]
        return [self.case("frame-count", h, arrays, f"{op} {how}", frozenset({"malformed"}))]

    def oversized(self) -> list[Case]:
        limit = self.limits.max_message_bytes
        how = self.rng.choice(("frame", "header", "string", "list", "map", "many-frames",
                               "empty-frames"))
        h, arrays = self.valid_request("push")
        allowed: frozenset[str] | None = frozenset({"too-large"})
        if how == "frame":
            n = (limit + self.rng.randrange(1, limit // 2)) // 4
            h["arrays"] = [{"dtype": "float32", "shape": [n]}]
            arrays = [bytes(4 * n)]
        elif how == "header":
            h["pad"] = ["p" * 1000] * 20  # > 16 KiB of header
        elif how == "string":
            h["note"] = "s" * (self.limits.max_str_len + 1)
            allowed = frozenset({"malformed"})
        elif how == "list":
            h["note"] = list(range(self.limits.max_array_len + 1))
            allowed = frozenset({"malformed"})
        elif how == "map":
            h["note"] = {str(i): i for i in range(self.limits.max_map_len + 1)}
            allowed = frozenset({"malformed"})
        elif how == "many-frames":
            per = limit // 8
            h["arrays"] = [{"dtype": "float32", "shape": [per // 4]}] * 4
            arrays = [bytes(per)] * 4 + [bytes(per)] * 6
            allowed = frozenset({"malformed", "too-large"})
        else:  # more frames than any request has; the daemon drops them unread
            h = self.header("ping")
            arrays = [b""] * self.rng.choice((self.limits.max_arrays + 1, 50, 900))
        return [self.case("oversized", h, arrays, how, allowed)]

    def values(self) -> list[Case]:
        op = self.rng.choice(("infer", "push"))
        dtype = self.rng.choice(("float32", "float32", "float16"))
        shape = self.window_shape if op == "infer" else self.frame_shape
        x = self._np.random(shape).astype(dtype)
        how = self.rng.choice(("nan", "inf", "-inf", "huge", "-huge", "max", "fp16-max",
                               "subnormal", "all-huge", "mixed-huge"))
        flat = x.reshape(-1)
        where = self._np.integers(0, flat.size, size=self.rng.randrange(1, 4))
        allowed: frozenset[str] | None = None
        if how in ("nan", "inf", "-inf"):
            flat[where] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[how]
            allowed = frozenset({"non-finite"}) | LOAD_CODES
        elif how == "huge":
            flat[where] = 3e38 if dtype == "float32" else 6e4
        elif how == "-huge":
            flat[where] = -3e38 if dtype == "float32" else -6e4
        elif how == "max":
            flat[where] = np.finfo(dtype).max
        elif how == "fp16-max":
            flat[where] = 65504.0
        elif how == "subnormal":
            flat[where] = np.finfo(dtype).tiny / 4
        elif how == "all-huge":
            flat[:] = 3e38 if dtype == "float32" else 6e4
        else:
            flat[:] = self._np.choice([3e38, -3e38, 0.0], size=flat.size).astype(dtype) \
                if dtype == "float32" else self._np.choice([6e4, -6e4, 0.0], size=flat.size)
        h = self.header(op, arrays=[{"dtype": dtype, "shape": list(shape)}])
        return [self.case("values", h, [x.tobytes()], f"{op} {dtype} {how}", allowed)]

    def unknown_op_model(self) -> list[Case]:
        if self.rng.random() < 0.5:
            op = self.rng.choice(("explode", "", "INFER", "ping ", "hello\x00", "x" * 100))
            h = self.header("ping", op=op)
            return [self.case("unknown-op-model", h, [], f"op {op!r}",
                              frozenset({"unknown-op"}))]
        op = self.rng.choice(("infer", "push", "reset"))
        # Not "": today's daemon serves the default model for it (reported to the lead).
        model = self.rng.choice(("nope", "DEMO", "demo ", "m" * 100))
        h, arrays = self.valid_request(op, model=model)
        return [self.case("unknown-op-model", h, arrays, f"{op} model {model!r}",
                          frozenset({"unknown-model"}))]

    def camera_id(self) -> list[Case]:
        how = self.rng.choice(("empty", "max", "over", "huge", "unicode", "invented",
                               "invented", "invented"))
        op = self.rng.choice(("ping", "hello", "reset", "push", "infer", "stats"))
        cam = {"empty": "", "max": "c" * self.limits.max_camera_len,
               "over": "c" * (self.limits.max_camera_len + 1), "huge": "c" * 1000,
               "unicode": "kamera-\u00e9\u4e2d\U0001f4f7-" + str(self.rng.randrange(4)),
               "invented": f"inv-{self.rng.getrandbits(48):012x}"}[how]
        h, arrays = self.valid_request(op, camera=cam)
        allowed = frozenset({"malformed"}) if how in ("empty", "over", "huge") else None
        return [self.case("camera-id", h, arrays, f"{op} camera {how}", allowed)]

    def timeout(self) -> list[Case]:
        value = self.rng.choice((0, 0.0, -1, -0.5, float("nan"), float("inf"), float("-inf"),
                                 1e-9, 1e308, 2**63 - 1, -(2**63), True, "100"))
        op = self.rng.choice(OPS)
        h, arrays = self.valid_request(op, timeout_ms=value)
        bad = (isinstance(value, (bool, str))
               or not math.isfinite(value) or value < 0)
        allowed = frozenset({"malformed"}) if bad else None
        return [self.case("timeout", h, arrays, f"{op} timeout_ms={value!r}", allowed)]

    def push_sequence(self) -> list[Case]:
        """Pushes for one camera with ids out of order and repeated, then a reset."""
        cam = f"{self.prefix}-seq-{self.rng.randrange(4)}"
        base = self.new_id()
        self._next_id += 64
        order = list(range(self.rng.randrange(3, 12)))
        self.rng.shuffle(order)
        for _ in range(self.rng.randrange(0, 4)):
            order.insert(self.rng.randrange(len(order) + 1), self.rng.choice(order))
        cases = []
        for k in order:
            h, arrays = self.valid_request("push", id=base + k, camera=cam)
            cases.append(self.case("push-sequence", h, arrays, f"push id {base + k} of {cam}"))
        if self.rng.random() < 0.5:
            h, _ = self.valid_request("reset", camera=cam, model=None)
            cases.append(self.case("push-sequence", h, [], f"reset {cam} model nil"))
        return cases

    def reset(self) -> list[Case]:
        model = self.rng.choice((None, None, "demo", "nope"))
        h, _ = self.valid_request("reset", model=model)
        allowed = frozenset({"unknown-model"}) if model == "nope" else None
        return [self.case("reset", h, [], f"reset model {model!r}", allowed)]

    def valid(self) -> list[Case]:
        op = self.rng.choice(OPS)
        h, arrays = self.valid_request(op)
        return [self.case("valid", h, arrays, f"valid {op}", frozenset({"ok"}) | LOAD_CODES)]
