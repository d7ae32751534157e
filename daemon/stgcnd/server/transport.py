"""The daemon's ROUTER socket: options, ipc socket files, binding with clear errors."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import zmq

from stgcnd.errors import UserError
from stgcnd.log import get_logger
from stgcnd.server.config import Config

log = get_logger(__name__)


def bind_router(ctx: zmq.Context, config: Config) -> tuple[zmq.Socket, Path | None]:
    """A bound ROUTER on the configured endpoint, and its ipc socket file if any."""
    endpoint = config.endpoint
    server = config.server
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    # Replies to a vanished client raise instead of being dropped silently (then logged).
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.SNDHWM, server.sndhwm)
    router.setsockopt(zmq.RCVHWM, server.rcvhwm)
    # Messages up to twice the limit still get a "too-large" reply; beyond that ZeroMQ
    # drops the peer's connection before we could read (and allocate) it.
    router.setsockopt(zmq.MAXMSGSIZE, 2 * server.max_message_bytes)
    ipc_path = Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://") else None
    if ipc_path is not None:
        prepare_ipc_path(ipc_path)
    try:
        router.bind(endpoint)
    except zmq.ZMQError as exc:
        router.close()
        raise UserError(f"cannot listen on {endpoint}: {exc.strerror}; is another stgcnd "
                        "running, or is the address wrong?") from None
    if ipc_path is not None:
        # Camera processes in the socket's group may connect (RuntimeDirectory is ours).
        os.chmod(ipc_path, server.socket_mode)
    return router, ipc_path


def prepare_ipc_path(path: Path) -> None:
    """Create the socket's directory; remove a stale socket file left by a killed daemon."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        return
    if not stat.S_ISSOCK(path.stat().st_mode):
        raise UserError(f"{path} exists and is not a socket; remove it or choose another "
                        "endpoint")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # nobody listens: a killed daemon's leftover
        log.info("stale_socket_removed", path=str(path))
        return
    finally:
        probe.close()
    raise UserError(f"another process is listening on {path}; stop it first "
                    "(systemctl stop stgcnd) or choose another endpoint")
