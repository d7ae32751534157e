"""Hypothesis strategies for the property fuzzer (tests/server/test_property_fuzz.py): every
header field the daemon reads, at its extremes, in per-camera sequences.

A `Scenario` is a few cameras and the steps sent for them, one request each (or a batch of
cases from the seeded generators of tests/fuzz_messages.py, or a pause). Its values are drawn
here; what depends on the run (camera ids unique to the example, request ids, a camera's
last `ts`) is filled in by `Player.cases`, so that an example replayed by hypothesis meets the
daemon in the same state: fresh cameras. The oracle of the reply id is fuzz_messages'
`expected_reply_id`, on the bytes sent.

Values msgpack cannot say from Python are markers packed by `pack`: a str whose bytes are not
UTF-8 (`RawStr`), a float 32 (`F32`), a map with repeated or non-string keys (`Pairs`).
"""

from __future__ import annotations

import functools
import math
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
from hypothesis import strategies as st

from stgcnd_client.protocol import Limits
from tests.fuzz_messages import LOAD_CODES, OPS, Case, Generator, expected_reply_id

# -- values msgpack.packb cannot make ---------------------------------------------------------


@dataclass(frozen=True)
class RawStr:
    """A msgpack str whose bytes need not be UTF-8."""
    data: bytes


@dataclass(frozen=True)
class F32:
    """A msgpack float 32."""
    value: float


@dataclass(frozen=True)
class Deep:
    """Arrays in arrays, `depth` levels (packed without recursion)."""
    depth: int


@dataclass(frozen=True)
class Pairs:
    """A msgpack map written entry by entry: keys may repeat or be of any type."""
    items: tuple[tuple[Any, Any], ...]


def _sized(small: int, fix: int, codes: tuple[int, int, int], n: int) -> bytes:
    if n < fix:
        return bytes([small | n])
    for code, fmt in zip(codes, (">B", ">H", ">I")):
        if code and n < 256 ** struct.calcsize(fmt):
            return bytes([code]) + struct.pack(fmt, n)
    raise ValueError(f"{n} is too long for msgpack")


def pack(value: Any) -> bytes:
    """msgpack of `value`, markers included (bytes are bin, as the client writes them)."""
    if isinstance(value, RawStr):
        return _sized(0xA0, 32, (0xD9, 0xDA, 0xDB), len(value.data)) + value.data
    if isinstance(value, F32):
        return b"\xca" + struct.pack(">f", value.value)
    if isinstance(value, Deep):
        return b"\x91" * value.depth + b"\x00"
    if isinstance(value, (dict, Pairs)):
        items = value.items if isinstance(value, Pairs) else tuple(value.items())
        return _sized(0x80, 16, (0, 0xDE, 0xDF), len(items)) + b"".join(
            pack(k) + pack(v) for k, v in items)
    if isinstance(value, (list, tuple)):
        return _sized(0x90, 16, (0, 0xDC, 0xDD), len(value)) + b"".join(pack(v) for v in value)
    return msgpack.packb(value, use_bin_type=True)


def nested(depth: int, leaf: Any = 0) -> Any:
    """A list in a map in a list ... `depth` levels deep."""
    for level in range(depth):
        leaf = [leaf] if level % 2 else {"n": leaf}
    return leaf


# -- the extremes -----------------------------------------------------------------------------

FLOATS = (1.7e308, -1.7e308, 1.7976931348623157e308, 1e306, -1e306, 5e-324, -5e-324, 1e-310,
          2.2250738585072014e-308, 0.0, -0.0, 0.5, 1e11, -1e11, 1.7e9, math.nan, math.inf,
          -math.inf)
INTS = (0, 1, -1, 2**31 - 1, 2**31, -(2**31), 2**32, 2**53, 2**53 + 1, -(2**53), 2**63 - 1,
        -(2**63), 2**64 - 1, 10**11, 1_700_000_000)
F32S = tuple(F32(v) for v in (3.4028234663852886e38, -3.4028234663852886e38, 1e-45, -0.0,
                              math.nan, math.inf, 1.5))
NOT_UTF8 = (RawStr(b"\xff"), RawStr(b"\xc3\x28"), RawStr(b"cam\xed\xa0\x80"),
            RawStr(b"\xf4\x90\x80\x80"), RawStr(b"ok\x80" * 20))


@functools.lru_cache(maxsize=None)  # built once (hypothesis validates each)
def strings(limits: Limits) -> st.SearchStrategy[Any]:
    """Strings at the limits that bound them: a camera id, any header string, and past
    them; text with NUL, MQTT wildcards, surrogates' neighbours, astral characters."""
    lengths = (0, 1, limits.max_camera_len, limits.max_camera_len + 1, limits.max_str_len,
               limits.max_str_len + 1)
    return st.one_of(
        st.sampled_from(lengths).map(lambda n: "s" * n),
        st.sampled_from(lengths[2:4]).map(lambda n: "\U0001f4f7" * n),  # 4 bytes each
        st.text(max_size=24),
        st.sampled_from(("\x00", "a\x00b", "+", "#", "a/b", "/", "$SYS/x", "\ufffd",
                         "\u202e", " ")),
        st.sampled_from(NOT_UTF8))


@functools.lru_cache(maxsize=None)  # built once (hypothesis validates each)
def scalars(limits: Limits) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(FLOATS), st.sampled_from(INTS), st.sampled_from(F32S),
        st.floats(), st.integers(-(2**63), 2**64 - 1), st.booleans(), st.none(),
        strings(limits), st.binary(max_size=8),
        st.just(msgpack.ExtType(1, b"x")))


@functools.lru_cache(maxsize=None)  # built once (hypothesis validates each)
def values(limits: Limits) -> st.SearchStrategy[Any]:
    """Any value a header key may be given: the extremes, nested containers (some past the
    array and map limits, some deeper than a decoder should recurse), wrong types."""
    small = st.recursive(
        scalars(limits),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3),
            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
        max_leaves=6)
    big = st.sampled_from((
        list(range(limits.max_array_len)), list(range(limits.max_array_len + 1)),
        {str(i): i for i in range(limits.max_map_len + 1)},
        Pairs(((1, 1), (None, 2), (b"k", 3))), nested(30), Deep(600), Deep(5000)))
    return st.one_of(small, small, big)


# -- a scenario -------------------------------------------------------------------------------

DELETE = object()                  # an edit that removes the key
CAMERA_STYLES = ("plain", "plain", "plain", "max", "unicode", "nul", "control", "mqtt", "over",
                 "empty")
TS_START = 1_700_000_000.0         # a Unix time: where a camera's clock starts by default
TS_RANGE_S = 1e11                  # docs/protocol.md: a ts is above -1e11 and below 1e11


@dataclass(frozen=True)
class Ts:
    """A step's `ts`: omitted; nil; the camera's last again; last + or - `amount`; `value`
    whatever the last was; or `value` of a wrong type."""
    kind: str
    value: Any = None


@dataclass(frozen=True)
class Step:
    op: str
    camera: int                     # index into Scenario.cameras
    ts: Ts
    model: Any = None
    dtype: str = "float32"
    fill: float = 0.0               # every value of the payload
    edits: tuple[tuple[Any, Any], ...] = ()   # (key, value or DELETE) after the rest
    resend: bool = False            # the camera's last request id again


@dataclass(frozen=True)
class Legacy:
    """Cases of fuzz_messages.Generator, seeded."""
    seed: int
    count: int


@dataclass(frozen=True)
class Pause:
    """Silence: the events' silent-camera sweep and the stats tick run meanwhile."""
    seconds: float


@dataclass(frozen=True)
class Scenario:
    cameras: tuple[str, ...]        # styles (CAMERA_STYLES)
    steps: tuple[Step | Legacy | Pause, ...]


@functools.lru_cache(maxsize=None)  # built once (hypothesis validates each)
def ts_moves(limits: Limits) -> st.SearchStrategy[Ts]:
    """Mostly a camera's clock going on (a frame later, the same again, a jump), so that
    predictions and events run on it; then a value whatever the last was, or a wrong type."""
    deltas = st.sampled_from((0.0, 5e-324, 1 / 30, 1 / 30, 1.0, 60.0, 1e6, 1e11, 1e300, 1e306,
                              1.7e308))
    absolute = st.one_of(st.sampled_from(FLOATS), st.sampled_from(INTS),
                         st.sampled_from(F32S), st.floats(), st.integers(-(2**63), 2**64 - 1))
    return st.one_of(
        st.sampled_from((Ts("forward", 1 / 30), Ts("forward", 1 / 30), Ts("same"), Ts("omit"),
                         Ts("nil"))),
        deltas.map(lambda d: Ts("forward", d)), deltas.map(lambda d: Ts("back", d)),
        absolute.map(lambda v: Ts("set", v)), values(limits).map(lambda v: Ts("raw", v)))


@functools.lru_cache(maxsize=None)  # built once (hypothesis validates each)
def field_values(key: str, limits: Limits) -> st.SearchStrategy[Any]:
    """Values aimed at one header key (its valid ones, near misses, extremes)."""
    dims = st.one_of(st.sampled_from(INTS), st.integers(-2, 40))
    spec = st.fixed_dictionaries({
        "dtype": st.one_of(st.sampled_from(("float32", "float16", "float64", "int8", "", "<f4",
                                            "FLOAT32", "f" * (limits.max_str_len + 1))),
                           strings(limits)),
        "shape": st.one_of(st.lists(dims, max_size=limits.max_ndim + 1), values(limits))})
    specific = {
        "v": st.sampled_from((1, 0, 2, -1, 2**64 - 1, 1.0, True, "1", F32(1.0))),
        "op": st.sampled_from((*OPS, "", "INFER", "infer\x00", "ping ", RawStr(b"p\xffing"))),
        "id": st.one_of(st.sampled_from(INTS), st.integers(-(2**63), 2**64 - 1),
                        st.sampled_from((1.0, True, "1", None))),
        "camera": strings(limits),
        "model": st.sampled_from(("demo", "demo2", "", "nope", "demo\x00", "DEMO", None,
                                  "m" * (limits.max_str_len + 1), RawStr(b"demo\xff"))),
        "timeout_ms": st.one_of(st.sampled_from(FLOATS), st.sampled_from(INTS)),
        "arrays": st.lists(spec, max_size=limits.max_arrays + 2),
        "ts": st.one_of(st.sampled_from(FLOATS), st.sampled_from(INTS), st.sampled_from(F32S)),
        # Past the header's own limit of bytes, or just within it.
        "pad": st.sampled_from((15, 16, 17)).map(
            lambda n: ["p" * limits.max_str_len] * n),
    }.get(key)
    return values(limits) if specific is None else st.one_of(specific, values(limits))


HEADER_KEYS = ("v", "op", "id", "camera", "model", "timeout_ms", "arrays", "ts", "pad")
ODD_KEYS = ("x", "", "TS", "ts ", "fields", "\x00", "k" * 1025, RawStr(b"\xffk"), 3, None,
            b"bin", 1.5)


@functools.lru_cache(maxsize=None)
def edits(limits: Limits) -> st.SearchStrategy[tuple[tuple[Any, Any], ...]]:
    return _edits(limits)


@st.composite
def _edits(draw: st.DrawFn, limits: Limits) -> tuple[tuple[Any, Any], ...]:
    out = []
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.one_of(st.sampled_from(HEADER_KEYS), st.sampled_from(HEADER_KEYS),
                             st.sampled_from(ODD_KEYS)))
        if isinstance(key, str) and draw(st.integers(0, 9)) == 0:
            out.append((key, DELETE))
        else:
            out.append((key, draw(field_values(key if isinstance(key, str) else "", limits))))
    return tuple(out)


STEP_KINDS = ("request",) * 187 + ("legacy",) * 12 + ("pause",)


@functools.lru_cache(maxsize=None)
def steps(cameras: int, limits: Limits) -> st.SearchStrategy[Step | Legacy | Pause]:
    return _steps(cameras, limits)


@st.composite
def _steps(draw: st.DrawFn, cameras: int, limits: Limits) -> Step | Legacy | Pause:
    # An index into a tuple: hypothesis favours the ends of an integer range and the numbers
    # written in the source, which made pauses (most of a run's time) far from rare.
    kind = draw(st.sampled_from(STEP_KINDS))
    if kind == "legacy":
        return Legacy(draw(st.integers(0, 2**32 - 1)), draw(st.integers(1, 6)))
    if kind == "pause":
        return Pause(draw(st.sampled_from((0.35, 0.35, 0.7))))
    # Mostly infer and push, the ops that read ts and reach the events.
    op = draw(st.sampled_from(("infer", "infer", "infer", "push", "push", "push", *OPS)))
    return Step(
        op=op, camera=draw(st.integers(0, cameras - 1)), ts=draw(ts_moves(limits)),
        model=draw(st.sampled_from((None, None, None, None, None, "demo", "demo2", "nope"))),
        dtype=draw(st.sampled_from(("float32", "float32", "float32", "float16"))),
        fill=draw(st.sampled_from((0.0, 0.0, 0.0, 0.5, -0.0, 1e-45, 3.4e38, -3.4e38, 6e4,
                                       math.nan))),
        edits=draw(edits(limits)) if draw(st.integers(0, 3)) == 0 else (),
        resend=draw(st.integers(0, 9)) == 0)


@st.composite
def scenarios(draw: st.DrawFn, limits: Limits) -> Scenario:
    cameras = tuple(draw(st.lists(st.sampled_from(CAMERA_STYLES), min_size=1, max_size=3)))
    return Scenario(cameras, tuple(draw(st.lists(steps(len(cameras), limits), min_size=1,
                                                 max_size=10))))


# -- from a scenario to the cases sent ---------------------------------------------------------

def camera_name(style: str, tag: str, limits: Limits) -> Any:
    """A camera id of `style` that no other example used (`tag` is unique to the run)."""
    if style == "max":
        return (tag + "-").ljust(limits.max_camera_len, "m")
    if style == "unicode":
        return f"kamera-\u00e9\u4e2d\U0001f4f7-{tag}"
    if style == "nul":
        return f"nul\x00{tag}"
    if style == "control":  # what a broker refuses in a topic as malformed UTF-8
        return f"c\x01\x7f\x85\ufdd0\uffff-{tag}"
    if style == "mqtt":  # not a valid MQTT topic level: the sink must cope
        return f"a/+/#/{tag}"
    if style == "over":
        return (tag + "-").ljust(limits.max_camera_len + 1, "o")
    if style == "empty":
        return ""
    return f"pf-{tag}"


@dataclass
class _Camera:
    name: Any
    ts: float = TS_START            # the last finite ts sent (accepted or not)
    last_id: int | None = None


@dataclass
class Player:
    """Turns scenarios into cases: request ids, camera ids and clocks of this run."""
    window_shape: tuple[int, ...]
    limits: Limits
    next_id: int = 10**9            # above fuzz_messages' ids: FuzzRunner's shared socket
    examples: int = 0
    frames_made: dict[tuple[str, str, float], bytes] = field(default_factory=dict)

    def cases(self, scenario: Scenario) -> Iterator[Case | Pause]:
        self.examples += 1
        cams = [_Camera(camera_name(style, f"{self.examples}-{i}", self.limits))
                for i, style in enumerate(scenario.cameras)]
        for step in scenario.steps:
            if isinstance(step, Pause):
                yield step
            elif isinstance(step, Legacy):
                gen = Generator(random.Random(step.seed), self.window_shape, self.limits,
                                camera_prefix=f"lg{self.examples}")
                made = 0
                while made < step.count:
                    for case in gen.make():
                        made += 1
                        yield case
            else:
                yield self._case(step, cams[step.camera])

    def ping(self) -> Case:
        """After a pause: whether the daemon lived through it."""
        self.next_id += 1
        header = {"v": 1, "op": "ping", "id": self.next_id, "camera": "pause", "model": None,
                  "timeout_ms": None, "arrays": []}
        case = Case("property", [pack(header)], "ping after a pause", frozenset({"ok"}),
                    header=header)
        case.reply_id = self.next_id
        return case

    def _payload(self, op: str, dtype: str, fill: float) -> tuple[bytes, list[int]]:
        shape = list(self.window_shape) if op == "infer" else \
            [self.window_shape[0], self.window_shape[2], self.window_shape[3]]
        key = (op, dtype, fill)
        if key not in self.frames_made:
            with np.errstate(over="ignore"):
                self.frames_made[key] = np.full(shape, fill, dtype).tobytes()
        return self.frames_made[key], shape

    def _case(self, step: Step, cam: _Camera) -> Case:
        op = step.op
        if step.resend and cam.last_id is not None:
            req_id = cam.last_id
        else:
            self.next_id += 1
            req_id = self.next_id
        cam.last_id = req_id
        header: dict[Any, Any] = {"v": 1, "op": op, "id": req_id, "camera": cam.name,
                                  "model": step.model, "timeout_ms": None, "arrays": []}
        arrays: list[bytes] = []
        if op in ("infer", "push"):
            payload, shape = self._payload(op, step.dtype, step.fill)
            header["arrays"] = [{"dtype": step.dtype, "shape": shape}]
            arrays = [payload]
        ts = self._ts(step.ts, cam)
        if step.ts.kind != "omit":
            header["ts"] = ts
        for key, value in step.edits:
            if value is DELETE:
                header.pop(key, None)
            else:
                header[key] = value
        case = Case("property", [pack(header), *arrays], self._note(step), header=header)
        case.reply_id = expected_reply_id(case.frames, self.limits)
        case.allowed = self._allowed(step, header, cam)
        return case

    @staticmethod
    def _ts(move: Ts, cam: _Camera) -> Any:
        if move.kind == "nil" or move.kind == "omit":
            return None
        if move.kind == "same":
            return cam.ts
        if move.kind in ("forward", "back"):
            value = cam.ts + move.value if move.kind == "forward" else cam.ts - move.value
        else:
            value = move.value
        number = value.value if isinstance(value, F32) else value
        if type(number) in (int, float) and math.isfinite(number) and \
                abs(number) < 1.7976931348623157e308:
            cam.ts = float(number)
        return value

    @staticmethod
    def _note(step: Step) -> str:
        edits = ", ".join(f"{k!r}={'<deleted>' if v is DELETE else _short(v)}"
                          for k, v in step.edits)
        return (f"{step.op} ts {step.ts.kind} {_short(step.ts.value)} model {step.model!r} "
                f"{step.dtype} fill {step.fill}" + (f"; edits {edits}" if edits else "")
                + ("; resend" if step.resend else ""))

    def _allowed(self, step: Step, header: dict[Any, Any], cam: _Camera) -> frozenset[str] | None:
        """What the protocol fixes for an otherwise valid infer or push: a `ts` that is not a
        number within +-TS_RANGE_S is `malformed` (docs/protocol.md, `ts`)."""
        if step.edits or step.op not in ("infer", "push") or step.model == "nope" or \
                not isinstance(cam.name, str) or not cam.name or \
                len(cam.name) > self.limits.max_camera_len or not math.isfinite(step.fill) or \
                (step.dtype == "float16" and abs(step.fill) > 65504):
            return None
        ts = header.get("ts")
        number = ts.value if isinstance(ts, F32) else ts
        if ts is not None and (type(number) not in (int, float) or
                               not -TS_RANGE_S < number < TS_RANGE_S):  # NaN included
            return frozenset({"malformed"}) | LOAD_CODES
        return None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"
