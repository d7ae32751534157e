"""What a stgcnd endpoint may look like, checked before any socket is made.

ZeroMQ's own errors for a wrong endpoint say little ("Invalid argument", "Protocol not
supported") and come only at the first call; these say what was wrong and what to write
instead. The daemon checks its own endpoints with the same rules (`listening=True`), so a
camera and the daemon agree on what an endpoint is.
"""

from __future__ import annotations

import re
from pathlib import Path

EXAMPLE = "ipc:///run/stgcnd/stgcnd.sock or tcp://127.0.0.1:5555"
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[\w.-]+|\*):(\d+|\*)$")
_WEB_SCHEMES = ("http", "https", "ws", "wss")


class EndpointError(ValueError):
    """An endpoint stgcnd cannot use; the message says what to write instead."""


def parse_endpoint(endpoint: str, *, listening: bool = False) -> tuple[str, str]:
    """("ipc", path) or ("tcp", "host:port") for a well-formed endpoint, else EndpointError.

    `listening`: checked for the daemon (which binds: host "*" allowed) rather than a client.
    """
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise EndpointError(f"the endpoint is empty; use {EXAMPLE}")
    if "://" not in endpoint:
        raise EndpointError(f"{endpoint!r} is not a ZeroMQ endpoint{_did_you_mean(endpoint)}")
    scheme, address = endpoint.split("://", 1)
    if scheme == "inproc":
        raise EndpointError(f"{endpoint}: inproc:// exists only inside one process, so no "
                            f"camera can reach it; use {EXAMPLE}")
    if scheme.lower() in _WEB_SCHEMES:
        host = address.split("/", 1)[0]
        raise EndpointError(f"{endpoint}: stgcnd speaks ZeroMQ, not {scheme.upper()}; use "
                            f"tcp://{host if ':' in host else host + ':5555'} (the port "
                            "the daemon's endpoint names) or an ipc:// path")
    if scheme not in ("ipc", "tcp"):
        raise EndpointError(f"{endpoint}: unsupported scheme {scheme + '://'!r}; use {EXAMPLE}")
    if scheme == "ipc":
        if not address:
            raise EndpointError(f"{endpoint}: ipc:// needs a socket path, e.g. "
                                "ipc:///run/stgcnd/stgcnd.sock")
        return scheme, address
    match = _HOST_PORT.match(address)
    if not match:
        no_port = ":" not in address.rsplit("]", 1)[-1]
        raise EndpointError(
            f"{endpoint}: expected tcp://HOST:PORT, e.g. tcp://127.0.0.1:5555"
            + (f" (the port is missing: tcp://{address}:5555 if the daemon listens on 5555)"
               if no_port and address else "")
            + (" (tcp://*:5555 listens on every interface)" if listening else ""))
    host, port = match.groups()
    if host == "*" and not listening:
        raise EndpointError(f"{endpoint}: '*' is for the daemon's side (every interface); "
                            f"connect to the daemon's address, e.g. tcp://127.0.0.1:{port}")
    if port == "*" or not 1 <= int(port) <= 65535:
        raise EndpointError(f"{endpoint}: the port must be a number from 1 to 65535 that "
                            "cameras can be told, e.g. tcp://127.0.0.1:5555")
    return scheme, address


def _did_you_mean(endpoint: str) -> str:
    text = endpoint.strip()
    if text.startswith("ipc:"):  # "ipc:/tmp/x.sock", "ipc:tmp/x.sock"
        text = text[len("ipc:"):]
    elif text.startswith("tcp:"):
        return f": did you mean tcp://{text[len('tcp:'):].lstrip('/')}?"
    if _HOST_PORT.match(text):
        return f": did you mean tcp://{text}?"
    if "/" in text or text.endswith(".sock"):
        return f": did you mean ipc://{Path(text).absolute()}?"
    return "; use ipc:///path/to/socket or tcp://host:port"
