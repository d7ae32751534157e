"""The daemon's ROUTER socket: options, ipc socket files, binding with clear errors."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import zmq

from stgcnd.errors import UserError
from stgcnd.log import get_logger
from stgcnd.server.config import Config
from stgcnd_client.endpoint import EndpointError
from stgcnd_client.endpoint import parse_endpoint as client_parse_endpoint

log = get_logger(__name__)

# ZeroMQ flags as plain ints for the I/O loop's per-request calls: pyzmq's constants are
# enums, and combining or passing them costs enum arithmetic on every use.
POLLIN = int(zmq.POLLIN)
NOBLOCK = int(zmq.NOBLOCK)
NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
HANDSHAKE_MS = 5000
# pyzmq's send without its Python wrapper (copy thresholds, groups): a reply's frames are
# small bytes, and the wrapper cost more than the send itself (RequestPath.send).
send_frame = zmq.backend.Socket.send


def make_router(ctx: zmq.Context[zmq.Socket[bytes]], config: Config) -> zmq.Socket[bytes]:
    """The daemon's ROUTER with its options, not bound yet (the connection monitor is set up
    before it accepts anything: server/connections.py)."""
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
    # A client completes ZeroMQ's handshake in milliseconds; a socket that does not is closed
    # after this (libzmq's default, 30 s, would let silent connections hold fds that long).
    router.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
    return router


def bind_router(router: zmq.Socket[bytes], config: Config) -> Path | None:
    """Bind the ROUTER on the configured endpoint; its ipc socket file, if any."""
    return bind_endpoint(router, config.endpoint, config.server.socket_mode,
                         f"cannot listen on {config.endpoint}", "is another stgcnd running, "
                         "or is the address wrong?")


def bind_endpoint(sock: zmq.Socket[bytes], endpoint: str, socket_mode: int, failed: str,
                  fix: str) -> Path | None:
    """Bind `sock` (a stale ipc socket file removed first, the new one given `socket_mode`);
    its ipc socket file, if any (none for tcp, nor for a Linux abstract socket, `ipc://@name`:
    it has no file, and no permissions: any process in the network namespace may connect).
    A failed bind is a UserError: "`failed`: why; `fix`"."""
    ipc_path = (Path(endpoint[len("ipc://"):]) if endpoint.startswith("ipc://")
                and not endpoint.startswith("ipc://@") else None)
    if ipc_path is not None:
        prepare_ipc_path(ipc_path)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        raise UserError(f"{failed}: {exc.strerror}; {fix}") from None
    if ipc_path is not None:
        # Camera processes in the socket's group may connect (RuntimeDirectory is ours).
        os.chmod(ipc_path, socket_mode)
    return ipc_path


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


# ---------------------------------------------------------------- endpoint checks before start-up

# A Unix socket path is at most 107 bytes (sun_path is 108 with the terminating NUL).
SUN_PATH_MAX = 107


def check_endpoint(endpoint: str) -> None:
    """Raise UserError unless the daemon can listen on `endpoint`.

    Cheap checks (no model is loaded yet), so that a wrong endpoint fails in a second with a fix,
    not after minutes of engine building: the scheme, the ipc socket's directory and path length,
    the tcp port, and whether something already listens there.
    """
    scheme, address = parse_endpoint(endpoint, listening=True)
    if scheme == "ipc":
        _check_ipc_listen(endpoint, address)
    else:
        host, port = address.rsplit(":", 1)
        _check_tcp_listen(endpoint, host, int(port))


def parse_endpoint(endpoint: str, *, listening: bool) -> tuple[str, str]:
    """("ipc", path) or ("tcp", "host:port") for a well-formed endpoint, else UserError.

    `listening`: checked for the daemon (which binds: host "*" allowed) rather than a client.
    The rules are the client's (stgcnd_client.endpoint), so that both agree.
    """
    try:
        return client_parse_endpoint(endpoint, listening=listening)
    except EndpointError as exc:
        raise UserError(str(exc)) from None


def _check_ipc_listen(endpoint: str, address: str) -> None:
    if address.startswith("@"):  # a Linux abstract socket: no file, no directory
        size = len(os.fsencode(address))
        if size > SUN_PATH_MAX:
            raise UserError(f"{endpoint}: the abstract socket name is {size} bytes, Unix "
                            f"sockets allow at most {SUN_PATH_MAX}; choose a shorter name")
        if _unix_socket_answers("\0" + address[1:]):
            raise UserError(f"{endpoint}: another process is listening on {address}; stop "
                            "it first or choose another name")
        return
    path = Path(address)
    size = len(os.fsencode(address))
    if size > SUN_PATH_MAX:
        raise UserError(f"{endpoint}: the socket path is {size} bytes, Unix sockets allow at "
                        f"most {SUN_PATH_MAX}; choose a shorter path, e.g. "
                        "ipc:///tmp/stgcnd.sock")
    try:
        # What bind_router does anyway; doing it now turns a missing or read-only directory
        # into an error before start-up rather than after it.
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{endpoint}: cannot create the socket's directory {path.parent}: "
                        f"{exc.strerror}; choose a directory you can write (e.g. "
                        "ipc:///tmp/stgcnd.sock), or under systemd let RuntimeDirectory= "
                        "create it") from None
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.stat().st_mode):
            raise UserError(f"{endpoint}: {path} exists and is not a socket; remove it or "
                            "choose another endpoint")
        if _unix_socket_answers(path):
            raise UserError(f"{endpoint}: another process is listening on {path}; stop it "
                            "first (systemctl stop stgcnd) or choose another endpoint")
        return  # a killed daemon's leftover: bind_router removes it
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.bind(address)  # the exact test: permissions, read-only file systems
    except OSError as exc:
        raise UserError(f"{endpoint}: cannot create a socket at {path}: {exc.strerror}; "
                        "choose a directory you can write (e.g. ipc:///tmp/stgcnd.sock)"
                        ) from None
    finally:
        probe.close()
    path.unlink()


def _unix_socket_answers(path: Path | str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
        return True
    except OSError:
        return False  # refused: a killed daemon's leftover, removed at bind time
    finally:
        probe.close()


def _check_tcp_listen(endpoint: str, host: str, port: int) -> None:
    # Binding a plain socket the way ZeroMQ will (SO_REUSEADDR) is the cheapest exact answer to
    # "can we listen here": it catches a port in use, a privileged port and an address that is
    # not this machine's. Host names other than localhost are left to ZeroMQ (no DNS here).
    address = host.strip("[]")
    if host == "*":
        address = "0.0.0.0"
    elif host == "localhost":
        address = "127.0.0.1"
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        socket.inet_pton(family, address)
    except OSError:
        return  # an interface or host name
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((address, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            reason = "another process is listening on that port (is stgcnd already running?)"
        elif exc.errno == errno.EACCES:
            reason = "ports below 1024 need privileges; use a port from 1024 up"
        elif exc.errno == errno.EADDRNOTAVAIL:
            reason = f"{host} is not an address of this machine; use * or 127.0.0.1"
        else:
            reason = exc.strerror or str(exc)
        raise UserError(f"cannot listen on {endpoint}: {reason}") from None
    finally:
        probe.close()
