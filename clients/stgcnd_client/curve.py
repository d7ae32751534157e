"""CURVE keys for a daemon on another machine (its [server] curve is on): the daemon's public
key and this client's pair, each a pyzmq certificate file or z85 text. A key the daemon does
not know is refused in the handshake: calls time out, and the daemon logs `curve_denied`.
"""

from __future__ import annotations

import os
from typing import Tuple, Union

import zmq
import zmq.auth

KeySource = Union[str, bytes, "os.PathLike[str]"]
# A client's pair: its NAME.key_secret file, or (public, secret) as z85 text.
ClientKey = Union[KeySource, Tuple[str, str]]
Z85_KEY_LENGTH = 40


def curve_options(server_key: KeySource | None, client_key: ClientKey | None
                  ) -> list[tuple[int, bytes]]:
    """Socket options (option, value) that make a DEALER a CURVE client; [] for no keys."""
    if server_key is None and client_key is None:
        return []
    if server_key is None or client_key is None:
        raise ValueError("CURVE needs both server_key (the daemon's public key: `stgcnd keys "
                         "server`) and client_key (this camera's pair: `stgcnd keys create "
                         "NAME`)")
    server_public, _ = _load(server_key, "server_key")
    if isinstance(client_key, tuple):
        public, secret = (_z85(k, "client_key") for k in client_key)
    else:
        public, secret_or_none = _load(client_key, "client_key")
        if secret_or_none is None:
            raise ValueError(f"client_key {client_key!r} holds no secret key; pass the "
                             "NAME.key_secret file, not NAME.key")
        secret = secret_or_none
    return [(zmq.CURVE_SERVERKEY, server_public), (zmq.CURVE_PUBLICKEY, public),
            (zmq.CURVE_SECRETKEY, secret)]


def _load(source: KeySource, what: str) -> tuple[bytes, bytes | None]:
    """(public, secret or None) from z85 text or a certificate file."""
    text = os.fsdecode(source) if not isinstance(source, bytes) else source.decode("ascii",
                                                                                   "replace")
    if len(text) == Z85_KEY_LENGTH and not os.path.exists(text):
        return _z85(text, what), None
    try:
        return zmq.auth.load_certificate(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{what}: cannot read a CURVE key from {text!r} ({exc}); pass a "
                         "40-character z85 key or a file written by `stgcnd keys`") from None


def _z85(key: str | bytes, what: str) -> bytes:
    raw = key.encode("ascii") if isinstance(key, str) else bytes(key)
    if len(raw) != Z85_KEY_LENGTH:
        raise ValueError(f"{what}: a z85 CURVE key has {Z85_KEY_LENGTH} characters, got "
                         f"{len(raw)}")
    return raw


def unreachable_hint(endpoint: str, keyed: bool) -> str:
    """Why a call found no daemon to send to, by transport: the end of Timeout's "could not
    reach" message. A daemon with CURVE on refuses, during ZeroMQ's handshake, a client
    without keys or with a key it does not know: the connection never completes, so the
    client cannot even send, which looks exactly like no daemon at all."""
    if not endpoint.startswith("tcp://"):
        return "is the daemon running, and may this process open its socket?"
    if not keyed:
        return ("is the daemon running and listening there? A daemon on another machine "
                "may need CURVE keys (its [server] curve is on): pass server_key= (its public "
                "key, `stgcnd keys server`) and client_key= (this camera's pair, made with "
                "`stgcnd keys create NAME` on the daemon's machine) to Client; see "
                "docs/remote-cameras.md")
    return ("is the daemon running and listening there, is server_key its public key "
            "(`stgcnd keys server`), and is this client's key authorized (`stgcnd keys "
            "list` on the daemon's machine; it logs refused keys as curve_denied)?")
