"""Refused ZeroMQ handshakes: who, why and what to do, logged at most once per reason per
LOG_EVERY_S (the client gets no reply, so the log is the only place that says why)."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from stgcnd.log import get_logger

log = get_logger(__name__)

# A client whose handshake fails gets no reply (with ZMQ_IMMEDIATE it cannot even send), so
# the daemon's log is the only place that can say why. Two places see a refusal:
#
# - the ZAP handler (server/curve.py): a CURVE key that is not authorized (`unknown-key`);
# - a listening socket's monitor (server/connections.py): HANDSHAKE_FAILED_PROTOCOL, whose
#   value is the ZMTP error: a client without keys on a CURVE socket (`no-keys`), one whose
#   server key is not this daemon's (`wrong-server-key`), one with keys on a socket without
#   CURVE (`curve-off`), or another protocol error (`protocol-error`, e.g. an HTTP client);
#   HANDSHAKE_FAILED_NO_DETAIL (`hung-up`): the peer closed the connection mid-handshake. Which
#   of the two a client whose mechanism does not match causes is a race: it sends its greeting
#   in two parts, and when the daemon's whole greeting reaches it first it finds the mismatch
#   and closes before the part that names its mechanism has left, so the daemon sees it hang up
#   (EPIPE) instead of a mismatch: often, on the loopback.
LOG_EVERY_S = 10.0

_PROTOCOL_FAILED = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
_MECHANISM_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
_CRYPTOGRAPHIC = int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
_PROTOCOL_ERRORS = {int(getattr(zmq, name)): name[len("PROTOCOL_ERROR_"):]
                    for name in dir(zmq) if name.startswith("PROTOCOL_ERROR_")}
KEYS_HOWTO = ("give the camera server_key (the daemon's public key: `stgcnd keys server`) and "
              "client_key (its pair: `stgcnd keys create NAME`); docs/remote-cameras.md")


@dataclass(frozen=True)
class Refusal:
    reason: str      # a short code, for filtering logs
    why: str         # what happened, in words
    action: str      # what to do about it


def hang_up_refusal(errno_value: int, curve: bool) -> Refusal:
    """A handshake the peer ended (errno `errno_value`, as the daemon saw it) on a socket
    with (`curve`) or without CURVE."""
    seen = errno.errorcode.get(errno_value, str(errno_value))
    if curve:
        return Refusal("hung-up", f"the client closed the connection during the handshake "
                       f"({seen}): what a client without CURVE keys does when the daemon's "
                       "greeting reaches it first (so does a port probe)", KEYS_HOWTO)
    return Refusal("hung-up", f"the client closed the connection during the handshake "
                   f"({seen}): what a client with CURVE keys does on a daemon whose curve is "
                   "off when its greeting reaches it first (so does a port probe)",
                   "connect without server_key/client_key, or set curve = \"on\" in [server]")


def protocol_refusal(error: int, curve: bool) -> Refusal:
    """Why a handshake that failed with ZMTP protocol error `error` failed, on a socket with
    (`curve`) or without CURVE."""
    if error == _MECHANISM_MISMATCH and curve:
        return Refusal("no-keys", "the client has no CURVE keys (or uses another mechanism)",
                       KEYS_HOWTO)
    if error == _MECHANISM_MISMATCH:
        return Refusal("curve-off", "the client uses CURVE keys, but this daemon's curve is "
                       "off", "connect without server_key/client_key, or set curve = \"on\" "
                       "in [server]")
    if error == _CRYPTOGRAPHIC:
        return Refusal("wrong-server-key", "the client's CURVE handshake does not decrypt: "
                       "its server_key is not this daemon's public key",
                       "give the camera the key `stgcnd keys server` prints")
    name = _PROTOCOL_ERRORS.get(error, str(error))
    return Refusal("protocol-error", f"ZeroMQ protocol error {name}",
                   "check that the client speaks ZeroMQ to this endpoint (a web client or "
                   "a port scanner does not)")


class Refusals:
    """Refused handshakes counted, and logged as `event` at most once per reason every
    LOG_EVERY_S, with `count_field` = how many of that reason since its last line."""

    def __init__(self, event: str, count_field: str) -> None:
        self.event = event
        self.count_field = count_field
        self.count = 0
        self._lock = threading.Lock()
        self._unlogged: dict[str, int] = {}      # reason -> refusals not in a line yet
        self._next_line: dict[str, float] = {}   # reason -> monotonic time of its next line

    def refused(self, refusal: Refusal, peer: str, **fields: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += 1
            reason = refusal.reason
            unlogged = self._unlogged.get(reason, 0) + 1
            if now < self._next_line.get(reason, 0.0):
                self._unlogged[reason] = unlogged
                return
            self._unlogged[reason] = 0
            self._next_line[reason] = now + LOG_EVERY_S
        log.warning(self.event, reason=reason, why=refusal.why, peer=peer,
                    **{self.count_field: unlogged}, window_s=LOG_EVERY_S,
                    action=refusal.action, **fields)


def monitor_reporter(refusals: Refusals, curve: bool) -> Callable[[int, int, str], None]:
    """What a socket's Connections calls with (monitor event, its value, peer) for a failed
    handshake: HANDSHAKE_FAILED_PROTOCOL (a ZMTP error) or _NO_DETAIL (an errno)."""
    def report(event: int, value: int, peer: str) -> None:
        refusal = (protocol_refusal(value, curve) if event == _PROTOCOL_FAILED
                   else hang_up_refusal(value, curve))
        address = {"address": peer[len("ip:"):]} if peer.startswith("ip:") else {}
        refusals.refused(refusal, peer, **address)
    return report
