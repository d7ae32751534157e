"""Every error code and every `busy` / `shutting-down` reason, each declared once, by its row
here: its value on the wire, what it means and what a client does about it; a reason also where
it is checked and, for a `busy` one, the limit it enforces. And the order in which the daemon
checks a request. One table, read by both sides.

Everything else is made from these rows by `stgcnd docs --write` (a test fails while anything is
stale): `protocol.ErrorCode`'s and `protocol.Reason`'s members (generated regions of
protocol.py), docs/protocol.md's tables of codes and reasons and its order of the checks (the
daemon's admission checks in the order admission.py runs them), docs/hardening.md's limits
table (a `busy` reason's `limits`, the default read from the configuration's schema). So a new
reason or code is one row in `REASONS` or `ERRORS` below; a new admission check also its
function and entry in daemon/stgcnd/server/admission.py's `CHECKS`. Neither the daemon's
serving path nor the client loads this module: only the documentation, and whoever wants the
text, do. In a text, `{key}` stands for a [server] key's default (the daemon's configuration,
which this package cannot read): the generator fills it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from .protocol import DEFAULT_LIMITS, OPS


@dataclass(frozen=True)
class CodeDoc:
    value: str          # on the wire: reply["error"]["code"] (`protocol.ErrorCode`'s member)
    meaning: str        # when the daemon answers it
    action: str         # what a client does about it


@dataclass(frozen=True)
class Limit:
    """A `busy` reason as a row of docs/hardening.md's limits a client can run into."""

    limit: str          # what is limited
    key: str = ""       # its configuration key: a [server] one, or "[[models]] KEY"
    default: str = "{default}"  # as the table says it ({default}: the key's, from the schema)
    sees: str = ""      # after the reason, what the client sees ("": where protocol.md says it)
    notes: str = ""     # what it costs, how it is counted


@dataclass(frozen=True)
class ReasonDoc:
    value: str          # on the wire: the error map's `reason` (`protocol.Reason`'s member)
    code: str           # the reply that carries it in its error map (an ERRORS value)
    when: str           # when the daemon says it
    action: str         # what a client does about it
    checked: str        # what is checked, as docs/protocol.md's order of the checks says it
    # A push refused for this reason: whether its frame is in the camera's window (the
    # error map's `appended`); None where that depends on when it came (not documented here).
    appended: bool | None = None
    limits: tuple[Limit, ...] = ()  # busy: docs/hardening.md's rows of the limit it enforces


def _value(value: str) -> str:
    """An enum member (`ErrorCode.BUSY`) or its value ("busy") -> the value."""
    return str(value.value) if isinstance(value, Enum) else value


def code(value: str) -> str:
    """A code as the documents write it (a KeyError for one that has no row)."""
    return f"`{ERRORS[_value(value)].value}`"


def reason(value: str) -> str:
    """A reason as the documents write it: with its reply's code."""
    doc = REASONS[_value(value)]
    return f"`{doc.code}` `{doc.value}`"


def checked(value: str) -> str:
    """What a reason's check looks at, with the reason, as the order of the checks says it."""
    return f"{REASONS[_value(value)].checked} ({reason(value)})"


def size(nbytes: int) -> str:
    """4194304 -> "4 MiB": a limit in bytes as the documents write it."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} bytes"


def _rows(*docs: CodeDoc) -> Mapping[str, CodeDoc]:
    return {doc.value: doc for doc in docs}


def _reasons(*docs: ReasonDoc) -> Mapping[str, ReasonDoc]:
    return {doc.value: doc for doc in docs}


_L = DEFAULT_LIMITS

# The error codes, in the order of docs/protocol.md §5 and of `protocol.ErrorCode`.
ERRORS: Mapping[str, CodeDoc] = _rows(
    CodeDoc("malformed",
            "header not msgpack / not a map / a key missing or of the wrong type / array "
            "count does not match frames or op", "fix the client"),
    CodeDoc("unsupported-version", "`v` is not 1", "speak v1"),
    CodeDoc("unknown-op", f"`op` is not one of the {len(OPS)} of §3", "fix the client"),
    CodeDoc("unknown-model", "no model of that name (`hello` lists them)",
            "fix the model name"),
    CodeDoc("bad-shape",
            "array shape differs from the model's (message gives the expected shape)",
            "fix the window/frame shape"),
    CodeDoc("bad-dtype", "dtype not `float32`/`float16`", "convert"),
    CodeDoc("bad-size", "frame length != shape x itemsize", "fix the encoder"),
    CodeDoc("non-finite",
            "NaN or Inf in the array (message says where), or the model's logits for this "
            "window were not finite (values too large for its precision)",
            "send 0 for missing keypoints; normalize coordinates"),
    CodeDoc("too-large",
            f"message over the size limit ({size(_L.max_message_bytes)} by default), or more "
            f"than {1 + _L.max_arrays} frames (a header and up to {_L.max_arrays} arrays)",
            "send less"),
    CodeDoc("busy", "not run, for the `reason` given (§4, \"The `busy` reply\")",
            "as that section says"),
    CodeDoc("expired", "could no longer meet `timeout_ms`; not run",
            "drop it; consider a longer budget"),
    CodeDoc("shutting-down",
            "the daemon is stopping, or a reload is replacing the model (`reason`, §4)",
            "as that reason says"),
    CodeDoc("internal", "a bug or a device failure in the daemon",
            "report it (with the daemon's log)"),
    CodeDoc("forbidden",
            "this connection's CURVE key is bound to other camera ids than `camera` (§10)",
            "use an id the key names, or a key for this camera"),
)

# The reasons, each in its code's table of docs/protocol.md §4 in this order.
REASONS: Mapping[str, ReasonDoc] = _reasons(
    ReasonDoc(
        "queue-full", "busy",
        "this camera already has `queue_size` (default {queue_size}) requests queued; a "
        "`push` meets the queue only when its frame made a prediction due",
        "drop the frame, or retry after a backoff (start at a recent reply's "
        "`timings.total_ms`, double it up to about 1 s, add jitter), and send less often",
        "room in the camera's queue", appended=True,
        limits=(Limit("queued requests per camera", "queue_size"),)),
    ReasonDoc(
        "no-camera-slot", "busy",
        "the daemon serves `max_cameras` (default {max_cameras}) cameras and none can give "
        "way to this new one yet (only a camera not yet in the table gets it); also at once "
        "for every new camera of a peer past `max_cameras` evictions a second "
        "(docs/hardening.md, \"Camera slots\", \"Churn\")",
        "wait at least 1 s and retry every few seconds: a slot frees when a camera has been "
        "idle for 5 s, or sooner from a process holding more than its share, or from one of "
        "your own process's cameras idle for 1 s (docs/hardening.md, \"Camera slots\")",
        "a camera slot", appended=False,
        limits=(
            Limit("cameras", "max_cameras",
                  "{default}, of which an eighth (`max_cameras` // 8, at least 1 from 2 up) "
                  "only for cameras served before",
                  "for a new camera when none can give way (below)",
                  "a camera costs 16 KiB after 3 pushed frames (M=1; 42 KiB at M=5), 120 KiB "
                  "with a full 150-frame window (585 KiB at M=5: its ring and the copy of its "
                  "last window kept for a resend, twice the window's 59/291 KiB), plus a lane "
                  "(a CUDA stream and pinned rows) per executor made before READY; measured "
                  "as a real daemon's RSS with 100 cameras"),
            Limit("camera evictions per peer", default="`max_cameras` a second",
                  sees="at once for its new cameras, nothing evicted",
                  notes="a counter per evicting peer, on the eviction path only"))),
    ReasonDoc(
        "too-often", "busy",
        "this camera's last infer or push to this model that was let through came less than "
        "the model's `min_interval_ms` ago (off by default; a resend of it is let through)",
        "send this model at most one request per `min_interval_ms` from a camera (the message "
        "says the interval); drop the frame, or keep it for the next request",
        "the model's `min_interval_ms` since the camera's last request let through",
        appended=False,
        limits=(Limit("a camera's requests to a model", "[[models]] min_interval_ms",
                      "{default} ms (off)",
                      notes="one every `min_interval_ms` from each camera, counted from its "
                      "last one let through (a resend of that one is let through too); a time "
                      "per camera and model"),)),
    ReasonDoc(
        "stopping", "shutting-down",
        "the daemon is stopping (also said by a model replaced by a reload whose queue did "
        "not finish within 30 s)",
        "back off; reconnect later", "the daemon's drain"),
    ReasonDoc(
        "model-replaced", "shutting-down", "a reload is replacing this model",
        "retry in a moment", "a model that a reload is replacing"),
)


def reasons_of(value: str) -> list[ReasonDoc]:
    """The reasons a reply of this code may carry, in the table's order."""
    return [doc for doc in REASONS.values() if doc.code == _value(value)]


# docs/protocol.md §3, "Order of the checks": a request is answered with the first problem
# found, in this order. Written with code()/reason()/checked(), so that every code and reason
# named here has its row. `{admission}` is where the daemon's admission checks go, each as
# checked() says it, in the order admission.py's CHECKS runs them (`stgcnd docs` fills it in);
# tests/test_generated_docs.py checks that every code and reason is named in the result.
CHECK_ORDER: tuple[str, ...] = (
    f"the message: a header frame over {size(_L.max_header_bytes)} "
    f"({code('too-large')}); a header that is not one msgpack map within the limits "
    f"of §2 ({code('malformed')}); more than {1 + _L.max_arrays} frames, or more than "
    f"{size(_L.max_message_bytes)} in all ({code('too-large')});",
    f"the header's keys, each in this order: `v` ({code('malformed')}, then "
    f"{code('unsupported-version')}), `id`, `op` ({code('malformed')}, then "
    f"{code('unknown-op')}), `camera`, `model` (its type), `timeout_ms`, `arrays` (a "
    f"list; per description, `dtype` a string, then a known one: {code('bad-dtype')}; "
    f"`shape` a list of ints, then at most {_L.max_ndim} non-negative dimensions: "
    f"{code('bad-shape')}), then the number of array frames against the descriptions "
    f"and the op ({code('malformed')});",
    f"each array frame's length against its **own** description ({code('bad-size')});",
    f"with CURVE, the connection's key against `camera` ({code('forbidden')}, §10);",
    f"`model`: a name the daemon does not serve ({code('unknown-model')}), whatever "
    "the op;",
    f"for `infer` and `push`, the array against the **model**: its shape "
    f"({code('bad-shape')}, the message gives the model's), then its values "
    f"({code('non-finite')}). So a frame whose bytes do not match its own header is "
    f"{code('bad-size')} whatever the model, and one that matches its header but not "
    f"the model is {code('bad-shape')}; an unknown model is said before either of them "
    "looks at the shape;",
    f"{checked('no-camera-slot')}, then {{admission}}`ts` against the camera's clock "
    f"({code('malformed')}, below), then {checked('queue-full')}, or "
    f"{checked('model-replaced')}; a `push` appends its frame before the queue, and meets "
    "it only if its frame made a prediction due (§4, \"The `busy` reply\");",
    f"when its batch is formed: the deadline ({code('expired')}), {checked('stopping')}; "
    f"then the run itself ({code('internal')}, or {code('non-finite')} logits).",
)
