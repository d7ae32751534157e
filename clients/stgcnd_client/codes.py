"""What each error code and each `busy` / `shutting-down` reason means and what a client does
about it, and the order in which the daemon checks a request: one table, read by both sides.

docs/protocol.md's tables of codes and reasons and its order of the checks are generated from
it (`stgcnd docs --write`; a test fails while they are stale), so a new reason is a member of
`protocol.Reason` and its row in `REASONS` below, and a new code a member of
`protocol.ErrorCode` and its row in `ERRORS` (tests/clients/test_codes.py names what is
missing). Neither the daemon's serving path nor the client loads this module: only the
documentation, and whoever wants the text, do. In a text, `{key}` stands for a [server] key's
default (the daemon's configuration, which this package cannot read): the generator fills it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .protocol import DEFAULT_LIMITS, OPS, ErrorCode, Reason


@dataclass(frozen=True)
class CodeDoc:
    meaning: str        # when the daemon answers it
    action: str         # what a client does about it


@dataclass(frozen=True)
class ReasonDoc:
    code: ErrorCode     # the reply that carries it in its error map
    when: str           # when the daemon says it
    action: str         # what a client does about it
    # A push refused for this reason: whether its frame is in the camera's window (the
    # error map's `appended`); None where that depends on when it came (not documented here).
    appended: bool | None = None


def code(value: ErrorCode) -> str:
    """A code as the documents write it."""
    return f"`{value.value}`"


def reason(value: Reason) -> str:
    """A reason as the documents write it: with its reply's code."""
    return f"`{REASONS[value].code.value}` `{value.value}`"


def size(nbytes: int) -> str:
    """4194304 -> "4 MiB": a limit in bytes as the documents write it."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} bytes"


_L = DEFAULT_LIMITS

ERRORS: Mapping[ErrorCode, CodeDoc] = {
    ErrorCode.MALFORMED: CodeDoc(
        "header not msgpack / not a map / a key missing or of the wrong type / array count "
        "does not match frames or op", "fix the client"),
    ErrorCode.UNSUPPORTED_VERSION: CodeDoc("`v` is not 1", "speak v1"),
    ErrorCode.UNKNOWN_OP: CodeDoc(f"`op` is not one of the {len(OPS)} of §3", "fix the client"),
    ErrorCode.UNKNOWN_MODEL: CodeDoc("no model of that name (`hello` lists them)",
                                     "fix the model name"),
    ErrorCode.BAD_SHAPE: CodeDoc(
        "array shape differs from the model's (message gives the expected shape)",
        "fix the window/frame shape"),
    ErrorCode.BAD_DTYPE: CodeDoc("dtype not `float32`/`float16`", "convert"),
    ErrorCode.BAD_SIZE: CodeDoc("frame length != shape x itemsize", "fix the encoder"),
    ErrorCode.NON_FINITE: CodeDoc(
        "NaN or Inf in the array (message says where), or the model's logits for this window "
        "were not finite (values too large for its precision)",
        "send 0 for missing keypoints; normalize coordinates"),
    ErrorCode.TOO_LARGE: CodeDoc(
        f"message over the size limit ({size(_L.max_message_bytes)} by default), or more than "
        f"{1 + _L.max_arrays} frames (a header and up to {_L.max_arrays} arrays)", "send less"),
    ErrorCode.BUSY: CodeDoc("not run, for the `reason` given (§4, \"The `busy` reply\")",
                            "as that section says"),
    ErrorCode.EXPIRED: CodeDoc("could no longer meet `timeout_ms`; not run",
                               "drop it; consider a longer budget"),
    ErrorCode.SHUTTING_DOWN: CodeDoc(
        "the daemon is stopping, or a reload is replacing the model (`reason`, §4)",
        "as that reason says"),
    ErrorCode.INTERNAL: CodeDoc("a bug or a device failure in the daemon",
                                "report it (with the daemon's log)"),
    ErrorCode.FORBIDDEN: CodeDoc(
        "this connection's CURVE key is bound to other camera ids than `camera` (§10)",
        "use an id the key names, or a key for this camera"),
}

REASONS: Mapping[Reason, ReasonDoc] = {
    Reason.QUEUE_FULL: ReasonDoc(
        ErrorCode.BUSY,
        "this camera already has `queue_size` (default {queue_size}) requests queued; a "
        "`push` meets the queue only when its frame made a prediction due",
        "drop the frame, or retry after a backoff (start at a recent reply's "
        "`timings.total_ms`, double it up to about 1 s, add jitter), and send less often",
        appended=True),
    Reason.NO_CAMERA_SLOT: ReasonDoc(
        ErrorCode.BUSY,
        "the daemon serves `max_cameras` (default {max_cameras}) cameras and none can give "
        "way to this new one yet (only a camera not yet in the table gets it); also at once "
        "for every new camera of a peer past `max_cameras` evictions a second "
        "(docs/hardening.md, \"Camera slots\", \"Churn\")",
        "wait at least 1 s and retry every few seconds: a slot frees when a camera has been "
        "idle for 5 s, or sooner from a process holding more than its share, or from one of "
        "your own process's cameras idle for 1 s (docs/hardening.md, \"Camera slots\")",
        appended=False),
    Reason.TOO_OFTEN: ReasonDoc(
        ErrorCode.BUSY,
        "this camera's last infer or push to this model that was let through came less than "
        "the model's `min_interval_ms` ago (off by default; a resend of it is let through)",
        "send this model at most one request per `min_interval_ms` from a camera (the message "
        "says the interval); drop the frame, or keep it for the next request",
        appended=False),
    Reason.STOPPING: ReasonDoc(
        ErrorCode.SHUTTING_DOWN,
        "the daemon is stopping (also said by a model replaced by a reload whose queue did "
        "not finish within 30 s)",
        "back off; reconnect later"),
    Reason.MODEL_REPLACED: ReasonDoc(
        ErrorCode.SHUTTING_DOWN, "a reload is replacing this model", "retry in a moment"),
}


def reasons_of(value: ErrorCode) -> list[Reason]:
    """The reasons a reply of this code may carry, in the table's order."""
    return [r for r, doc in REASONS.items() if doc.code is value]


# docs/protocol.md §3, "Order of the checks": a request is answered with the first problem
# found, in this order. Written with code()/reason(), so that every code and reason named here
# exists; tests/clients/test_codes.py checks that each one is named somewhere in it.
CHECK_ORDER: tuple[str, ...] = (
    f"the message: a header frame over {size(_L.max_header_bytes)} "
    f"({code(ErrorCode.TOO_LARGE)}); a header that is not one msgpack map within the limits "
    f"of §2 ({code(ErrorCode.MALFORMED)}); more than {1 + _L.max_arrays} frames, or more than "
    f"{size(_L.max_message_bytes)} in all ({code(ErrorCode.TOO_LARGE)});",
    f"the header's keys, each in this order: `v` ({code(ErrorCode.MALFORMED)}, then "
    f"{code(ErrorCode.UNSUPPORTED_VERSION)}), `id`, `op` ({code(ErrorCode.MALFORMED)}, then "
    f"{code(ErrorCode.UNKNOWN_OP)}), `camera`, `model` (its type), `timeout_ms`, `arrays` (a "
    f"list; per description, `dtype` a string, then a known one: {code(ErrorCode.BAD_DTYPE)}; "
    f"`shape` a list of ints, then at most {_L.max_ndim} non-negative dimensions: "
    f"{code(ErrorCode.BAD_SHAPE)}), then the number of array frames against the descriptions "
    f"and the op ({code(ErrorCode.MALFORMED)});",
    f"each array frame's length against its **own** description ({code(ErrorCode.BAD_SIZE)});",
    f"with CURVE, the connection's key against `camera` ({code(ErrorCode.FORBIDDEN)}, §10);",
    f"`model`: a name the daemon does not serve ({code(ErrorCode.UNKNOWN_MODEL)}), whatever "
    "the op;",
    f"for `infer` and `push`, the array against the **model**: its shape "
    f"({code(ErrorCode.BAD_SHAPE)}, the message gives the model's), then its values "
    f"({code(ErrorCode.NON_FINITE)}). So a frame whose bytes do not match its own header is "
    f"{code(ErrorCode.BAD_SIZE)} whatever the model, and one that matches its header but not "
    f"the model is {code(ErrorCode.BAD_SHAPE)}; an unknown model is said before either of them "
    "looks at the shape;",
    f"a camera slot ({reason(Reason.NO_CAMERA_SLOT)}), then the model's `min_interval_ms` "
    f"since the camera's last request let through ({reason(Reason.TOO_OFTEN)}), then `ts` "
    "against the camera's clock "
    f"({code(ErrorCode.MALFORMED)}, below), then room in the camera's queue "
    f"({reason(Reason.QUEUE_FULL)}; a model that a reload is replacing: "
    f"{reason(Reason.MODEL_REPLACED)}); a `push` appends its frame before the queue, and meets "
    "it only if its frame made a prediction due (§4, \"The `busy` reply\");",
    f"when its batch is formed: the deadline ({code(ErrorCode.EXPIRED)}), the daemon's drain "
    f"({reason(Reason.STOPPING)}); then the run itself ({code(ErrorCode.INTERNAL)}, or "
    f"{code(ErrorCode.NON_FINITE)} logits).",
)
