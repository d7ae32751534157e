"""Every generated part of the documentation, and where it goes (`stgcnd docs`).

Each part is made from what the code declares: the error codes and busy / shutting-down
reasons from their rows in `stgcnd_client.codes` (their tables, protocol.py's `ErrorCode` and
`Reason` members, a busy reason's limits in docs/hardening.md), the order of the checks from
`codes.CHECK_ORDER` with the admission checks in the order server/admission.py runs them, the
message limits from `stgcnd_client.protocol.Limits`, the configuration's keys and defaults from
its schema (server/config.py). A part lives in a marked region of a hand-written file
(docs/regions.py), or is a whole file (systemd/stgcnd.toml). tests/test_generated_docs.py
fails while any part is stale.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from stgcnd.server.admission import CHECKS
from stgcnd.server.config import ModelConfig, ServerConfig
from stgcnd.server.config_docs import example, key_table
from stgcnd.server.transport import HANDSHAKE_MS
from stgcnd_client import codes
from stgcnd_client.codes import CHECK_ORDER, ERRORS, REASONS, Limit, checked, reasons_of, size
from stgcnd_client.protocol import DEFAULT_LIMITS, ErrorCode
from stgcnd_tools.docs.regions import replace

FIX = "stgcnd docs --write"
CODES = "clients/stgcnd_client/codes.py"
SCHEMA = "daemon/stgcnd/server/config.py"
PROTOCOL = "clients/stgcnd_client/protocol.py"


@dataclass(frozen=True)
class Part:
    name: str
    path: str                   # relative to the repository's root
    source: str                 # what it is made from, named in its marker
    render: Callable[[], str]
    whole_file: bool = False    # the file is the part (no markers)


def server_defaults() -> dict[str, str]:
    """[server] key -> its default as the documents write it ({queue_size} in a text)."""
    out = {}
    for key, value in msgspec.to_builtins(ServerConfig()).items():
        if isinstance(value, float):
            out[key] = f"{value:g}"
        elif isinstance(value, int):
            out[key] = size(value) if key == "max_message_bytes" else str(value)
    return out


def _text(template: str, **more: str) -> str:
    return template.format_map({**server_defaults(), **more})


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def error_codes() -> str:
    return table(("code", "meaning", "client action"),
                 [(codes.code(c.value), _text(c.meaning), _text(c.action))
                  for c in ERRORS.values()])


def members(values: Sequence[str], comments: Sequence[str] = ()) -> str:
    """An enum's members (protocol.py's ErrorCode, Reason), one per value: "too-often" ->
    `TOO_OFTEN = "too-often"`, with its comment."""
    return "".join(f'{v.upper().replace("-", "_")} = "{v}"'
                   + (f"  # {comments[n]}" if comments else "") + "\n"
                   for n, v in enumerate(values))


def error_code_members() -> str:
    return members(list(ERRORS))


def reason_members() -> str:
    return members(list(REASONS), [doc.code for doc in REASONS.values()])


_APPENDED = {True: "kept (`true`): only the prediction was refused", False: "not kept (`false`)",
             None: "as §3, \"Which frames were appended\" says"}


def reasons(code: ErrorCode) -> str:
    """The reasons a reply of `code` carries; the `appended` column where the table says it."""
    rows = reasons_of(code)
    with_appended = any(doc.appended is not None for doc in rows)
    header = ("`reason`", "sent when") + (("a push's frame (`appended`)",) if with_appended
                                          else ()) + ("what to do",)
    return table(header, [
        (f"`{doc.value}`", _text(doc.when))
        + ((_APPENDED[doc.appended],) if with_appended else ()) + (_text(doc.action),)
        for doc in rows])


def check_order() -> str:
    """codes.CHECK_ORDER, its `{admission}` the admission checks in the order admit runs them
    (server/admission.py's CHECKS), each as its reason's row says it."""
    admission = "".join(f"{checked(reason)}, then " for reason, _ in CHECKS)
    return "".join(textwrap.fill(f"{n}. {_text(step, admission=_text(admission))}", 96,
                                 subsequent_indent="   ", break_on_hyphens=False) + "\n"
                   for n, step in enumerate(CHECK_ORDER, 1))


def message_limits() -> str:
    L = DEFAULT_LIMITS
    c = codes.code
    return table(("limit", "value", "error when exceeded"), [
        ("whole message (all frames)", size(L.max_message_bytes), c(ErrorCode.TOO_LARGE)),
        ("header frame", size(L.max_header_bytes), c(ErrorCode.TOO_LARGE)),
        ("any string in the header (a key too)", f"{L.max_str_len} characters (Unicode code "
         f"points; at most {4 * L.max_str_len} bytes)", c(ErrorCode.MALFORMED)),
        ("any list in the header", f"{L.max_array_len} items", c(ErrorCode.MALFORMED)),
        ("any map in the header", f"{L.max_map_len} entries", c(ErrorCode.MALFORMED)),
        ("containers nested in the header (its own map the first; a request nests 4 deep)",
         f"{L.max_depth} deep", c(ErrorCode.MALFORMED)),
        ("arrays per message", str(L.max_arrays), c(ErrorCode.MALFORMED)),
        ("array dimensions", str(L.max_ndim), c(ErrorCode.BAD_SHAPE)),
        ("any dimension, and the product of the non-zero ones",
         "message limit / itemsize (elements)", c(ErrorCode.BAD_SHAPE)),
        ("camera id", f"{L.max_camera_len} characters (Unicode code points of the UTF-8 "
         f"string; at most {4 * L.max_camera_len} bytes)", c(ErrorCode.MALFORMED)),
    ])


def key_default(key: str) -> str:
    """A configuration key's default as the documents write it: "queue_size" ([server]) or
    "[[models]] min_interval_ms", from the schema."""
    if key.startswith("[[models]] "):
        fields = {f.name: f.default for f in msgspec.structs.fields(ModelConfig)}
        return str(fields[key.split()[-1]])
    return server_defaults()[key]


def limit_rows(busy_reply: str) -> list[tuple[str, str, str, str]]:
    """A `busy` reason's limits (their rows in codes.py's REASONS) as rows of the limits
    table: the key's default from the schema."""
    def row(doc: codes.ReasonDoc, limit: Limit) -> tuple[str, str, str, str]:
        name = f"{limit.limit} (`{limit.key}`)" if limit.key else limit.limit
        default = _text(limit.default, default=key_default(limit.key) if limit.key else "")
        return (name, default, f"{codes.reason(doc.value)} {_text(limit.sees) or busy_reply}",
                _text(limit.notes))
    return [row(doc, limit) for doc in reasons_of(ErrorCode.BUSY) for limit in doc.limits]


def hardening_limits() -> str:
    """docs/hardening.md's list of every limit a client can run into: the defaults from the
    schema and the codec's Limits, what a client sees from the codes' table; a busy reason's
    rows from its row there."""
    L, d, c = DEFAULT_LIMITS, server_defaults(), codes.code
    busy_reply = ("(what it means and what to do: [protocol.md, \"The `busy` reply\"]"
                  "(protocol.md#the-busy-reply))")
    return table(("limit", "default", "a client that hits it sees", "cost / notes"), [
        ("message size (`max_message_bytes`)", d["max_message_bytes"], c(ErrorCode.TOO_LARGE),
         "a frame over twice this is dropped by libzmq (ZMQ_MAXMSGSIZE) with the connection"),
        ("frames per request", f"{1 + L.max_arrays} (a header and up to {L.max_arrays} arrays)",
         f"{c(ErrorCode.TOO_LARGE)} once",
         "the rest of the message is dropped unread, 20,000 frames per loop pass (1-3 us a "
         "frame: other cameras wait that long); a message of about 250,000 frames or more is "
         "cut while it arrives (memory growth, below)"),
        ("frames per message, abusive", "over 1,000",
         f"{c(ErrorCode.TOO_LARGE)}, then the connection closed and its peer refused for 10 s",
         "peer: the client's process (ipc, SO_PEERCRED) or its address (tcp); a loopback tcp "
         "peer (its user) and a process in another pid namespace lose that connection only"),
        ("header", f"{size(L.max_header_bytes)}, strings {L.max_str_len:,} chars, lists/maps "
         f"{L.max_array_len}, nesting {L.max_depth}, {L.max_arrays} arrays of at most "
         f"{L.max_ndim} dims, camera id {L.max_camera_len} chars",
         f"{c(ErrorCode.TOO_LARGE)} / {c(ErrorCode.MALFORMED)} / {c(ErrorCode.BAD_SHAPE)}",
         "checked before anything is allocated for the arrays"),
        ("header numbers", "`ts` above -1e11 and below 1e11 s; `timeout_ms` finite and >= 0 "
         "(any size: 1.7e308 only waits); `id` any msgpack int (echoed); `v` 1",
         f"{c(ErrorCode.MALFORMED)} with the range ({c(ErrorCode.UNSUPPORTED_VERSION)} for "
         "`v`)",
         "checked where each is decoded, before the camera's clock or its events see it: a "
         "`ts` of 1e306 made the events' milliseconds infinite and killed the daemon (issue "
         "#41; below, \"A bug met for one camera\")"),
        *limit_rows(busy_reply),
        ("served camera ids remembered", f"4 x `max_cameras` ({4 * int(d['max_cameras'])})",
         "a served camera forgotten is a new one again", "the most recently active"),
        ("idle camera (`idle_timeout`)", f"{d['idle_timeout']} s",
         "its push window starts over", "its slot and lane are freed"),
        ("connections (`max_connections`)", "auto: 3/4 of the free fds after a reserve, at "
         "most 4,096 (569 with the fd limit at 1,024); with `events_endpoint`, subscribers get "
         "an eighth of it (71 there) and cameras the rest",
         "past the cap nothing more is accepted: a new connection waits in the kernel's "
         "backlog while the loop makes room, first closing connections that never sent "
         "anything, then those quiet for 1 s (subscribers: only those that never subscribed), "
         "else the least recently active of a peer holding more than its share; a DEALER "
         "reconnects",
         "one fd each; the count never passes the cap (the accept gate, below); the soft fd "
         "limit is raised to the hard one at start (`fd_limit` log line), the unit sets "
         "`LimitNOFILE=65536`"),
        ("subscriptions per events connection", "1,024 held, 8,192 sent in its life, topic at "
         "most 1 KiB",
         "over the counts: the connection closed and its peer refused for 10 s; a longer "
         "topic: the connection dropped by libzmq (ZMQ_MAXMSGSIZE) before the daemon holds it",
         "every (un)subscription is read by the loop (XPUB_VERBOSER); events queued per "
         "subscriber: 1,000 (SNDHWM)"),
        ("(un)subscriptions per events peer", "8,192 in 10 s over all its connections",
         "the peer refused for 10 s (a loopback user: each of its connections that sent over "
         "1,024 closed, one line a window)", '"Snapshot churn", below'),
        ("snapshots a subscriber causes", "its connection's first at once (8 per peer until it "
         "is quiet for 10 s); every later one waits", "a resubscription's snapshot within 10 s",
         "all waiting asks, of every peer, share one snapshot every 10 s"),
        ("a revoked CURVE key", "",
         f"requests: {c(ErrorCode.FORBIDDEN)}; a subscriber connected with it is cut at the "
         "reload, and its reconnect fails the handshake", "`events_subscriber_cut` log line"),
        ("handshake", f"{HANDSHAKE_MS / 1000:g} s",
         "a socket that does not complete ZeroMQ's handshake is closed",
         "libzmq's default is 30 s"),
        ("resident memory (`max_rss_mb`)", "auto: the size at READY (and after each reload, "
         "and once an upgrade's runners are made) + 512 MB",
         "over it, connections that never delivered a request, or are quiet for 1 s, are "
         "closed (a subscriber quiet since it subscribed stays: its events are bounded by "
         "SNDHWM, and a SUB cut while events flow to it can abort in libzmq 4.3.5's recv); "
         "while the daemon makes runners of its own (a reload's models, an upgrade's runners: "
         "2.1 GB more for torch's ten tuned buckets on an H100), only those the growth row "
         "cuts, and nothing is trimmed",
         "checked ten times a second (a 2-7 us read of /proc/self/statm; 10 us a check in all)"),
        ("memory growth", "16 MB within 0.5 s, beyond 64 KB per connection accepted meanwhile "
         "(not while the daemon makes runners of its own)",
         "connections that never delivered a request (after 20 ms), and those, whatever they "
         "delivered before, quiet for 50 ms with bytes unread in the kernel at two checks in a "
         "row, are closed: a message of millions of frames is cut before it is complete",
         "never a connection owed a reply (a batch's own allocations grow as fast: 43 MB for "
         "16 joining cameras on torch CPU), nor an idle camera or subscriber (nothing unread)"),
        ("memory held after abuse or a burst", "", "",
         "malloc_trim once the RSS settled 8 MB above the last trim's result, or after a cut "
         "connection, an oversized message or a dropped reply (the next check, no longer the "
         "next stats tick); at most once a second, followed by one more while a trim still "
         "gives back 1 MB or more"),
        ("unread replies per client (`sndhwm`)", f"{int(d['sndhwm']):,}",
         "further replies dropped (`replies_dropped`)", "the loop never waits for a reader"),
        ("requests per connection in flight (`rcvhwm`)", f"{int(d['rcvhwm']):,}",
         "the client's own send blocks", "ZeroMQ's back-pressure"),
        ("shutdown (`drain_timeout`)", f"{d['drain_timeout']} s",
         f"queued work answered, then {codes.reason('stopping')}",
         "requests are refused until none arrives for 100 ms (at most 1 s); replies get 1 s "
         "to leave"),
    ])


PARTS: tuple[Part, ...] = (
    Part("error-code-members", PROTOCOL, CODES, error_code_members),
    Part("reason-members", PROTOCOL, CODES, reason_members),
    Part("config-keys", "README.md", SCHEMA, key_table),
    Part("config-example", "systemd/stgcnd.toml", SCHEMA, example, whole_file=True),
    Part("message-limits", "docs/protocol.md", "stgcnd_client.protocol.Limits", message_limits),
    Part("check-order", "docs/protocol.md", CODES, check_order),
    Part("shutting-down-reasons", "docs/protocol.md", CODES,
         lambda: reasons(ErrorCode.SHUTTING_DOWN)),
    Part("busy-reasons", "docs/protocol.md", CODES, lambda: reasons(ErrorCode.BUSY)),
    Part("error-codes", "docs/protocol.md", CODES, error_codes),
    Part("limits", "docs/hardening.md", f"{CODES}, {SCHEMA}", hardening_limits),
)


def generated(root: Path) -> dict[Path, str]:
    """Every file that holds a part, as it is with every part made afresh."""
    out: dict[Path, str] = {}
    for part in PARTS:
        path = root / part.path
        if part.whole_file:
            out[path] = part.render()
            continue
        text = out.get(path)
        if text is None:
            text = path.read_text()
        out[path] = replace(text, part.name, part.source, part.render(), part.path)
    return out


def stale(root: Path) -> list[str]:
    """The files whose generated parts are not what the code makes now."""
    return [str(path.relative_to(root)) for path, text in generated(root).items()
            if not path.is_file() or path.read_text() != text]


def write(root: Path) -> list[str]:
    """Make every part afresh; the files that changed."""
    changed = stale(root)
    for path, text in generated(root).items():
        if str(path.relative_to(root)) in changed:
            path.write_text(text)
    return changed
