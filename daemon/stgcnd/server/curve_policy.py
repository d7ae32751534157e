"""What every server knows of CURVE, on or off: whether it is on, a reachable endpoint without
it refused, a client's key, and what the server, the request path and the events feed ask of
the key handler (server/curve.py: a thread and key files, loaded only where CURVE is on).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Protocol

import zmq

from stgcnd.errors import UserError
from stgcnd.server.config import Config
from stgcnd.server.handshakes import Refusals


@dataclass(frozen=True)
class ClientKey:
    name: str                   # its file's name without .key
    public: str                 # z85, 40 characters: the connection's ZAP User-Id
    cameras: tuple[str, ...]    # the camera ids it may use; empty: any

    def allows(self, camera: str) -> bool:
        return not self.cameras or camera in self.cameras


class KeyHandler(Protocol):
    """server/curve.py's Curve, as its users see it."""

    keys: dict[str, ClientKey]  # by public key; swapped whole on reload
    refusals: Refusals          # refused handshakes
    dropped: int                # requests refused: their key was revoked since

    def secure(self, socket: zmq.Socket[bytes]) -> None: ...
    def reload(self) -> None: ...
    def close(self) -> None: ...


def curve_enabled(config: Config) -> bool:
    """curve = on/off, or auto: on where the endpoint or the events endpoint is a tcp one that
    other machines can reach."""
    if config.server.curve != "auto":
        return config.server.curve == "on"
    return any(reachable(e) for e in (config.endpoint, config.server.events_endpoint))


def reachable(endpoint: str) -> bool:
    return endpoint.startswith("tcp://") and not loopback(endpoint)


def loopback(endpoint: str) -> bool:
    host = endpoint.split("://", 1)[1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface or a host name: assume others can reach it


def check_security(config: Config) -> None:
    """A tcp endpoint others can reach, without CURVE: anyone reaching the port could submit
    work and read (or reset) every camera's predictions. Refused unless insecure = true."""
    if curve_enabled(config) or config.server.insecure:
        return
    for endpoint in (config.endpoint, config.server.events_endpoint):
        if reachable(endpoint):
            raise UserError(f"{endpoint} is reachable from other machines but curve = "
                            "\"off\": anyone who reaches the port could use every camera or "
                            "read every event; set curve = \"auto\" and give cameras keys "
                            "(`stgcnd keys create`), listen on 127.0.0.1, or set insecure = "
                            "true in [server]")
