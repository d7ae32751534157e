"""ZeroMQ CURVE for cameras on other machines: the daemon's key pair, the allowed client
keys (pyzmq certificate files, reread on SIGHUP, optionally bound to camera ids) and the ZAP
handler, a thread that answers from the keys in memory so that no handshake waits on a file.
Loaded only where CURVE is on (server/server.py); what every server needs of CURVE is in
server/curve_policy.py.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from stgcnd.errors import UserError
from stgcnd.log import get_logger
from stgcnd.server.config import Config
from stgcnd.server.curve_policy import ClientKey
from stgcnd.server.handshakes import Refusal, Refusals
from stgcnd.threadname import name_os_thread

log = get_logger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP spec (RFC 27)
SERVER_NAME = "server"
POLL_MS = 100  # how soon the handler thread notices stop()
UNKNOWN_KEY = Refusal("unknown-key", "the client's CURVE key is not authorized",
                      "add the client's .key to the authorized directory (`stgcnd keys "
                      "create`), then `systemctl reload stgcnd`")


# ------------------------------------------------------------------------- where the keys live

def keys_dir(config: Config) -> Path:
    """[server] keys_dir, else systemd's StateDirectory/keys (next to the engine store), else
    the user's state directory: not a cache, whose loss would lock every camera out."""
    if config.server.keys_dir:
        return Path(config.server.keys_dir).expanduser()
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0]) / "keys"
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "stgcnd" / "keys"


def authorized_dir(config: Config) -> Path:
    if config.server.authorized_keys_dir:
        return Path(config.server.authorized_keys_dir).expanduser()
    return keys_dir(config) / "authorized"


# --------------------------------------------------------------------------------- key files

def server_keypair(directory: Path) -> tuple[bytes, bytes]:
    """(public, secret) z85 of the daemon, made on first start."""
    secret_file = directory / f"{SERVER_NAME}.key_secret"
    if not secret_file.exists():
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        old = os.umask(0o077)  # the secret is never readable by others, not even briefly
        try:
            zmq.auth.create_certificates(str(directory), SERVER_NAME)
        finally:
            os.umask(old)
        (directory / f"{SERVER_NAME}.key").chmod(0o644)
        log.info("curve_keys_created", directory=str(directory))
    secret_file.chmod(0o600)
    public, secret = zmq.auth.load_certificate(str(secret_file))
    if secret is None:
        raise UserError(f"{secret_file} has no secret-key; remove {directory}/{SERVER_NAME}"
                        ".key* to make a new pair (every client then needs the new public key)")
    return public, secret


def read_key(path: Path) -> ClientKey:
    """A client's NAME.key: its public key and the `cameras` of its metadata section."""
    try:
        public, _ = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a CURVE public key file ({exc}); make one with "
                        "`stgcnd keys create NAME`") from None
    cameras: tuple[str, ...] = ()
    section = ""
    for line in path.read_text().splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            section = line.strip()
        elif section == "metadata" and "=" in line:
            name, value = (part.strip() for part in line.split("=", 1))
            if name == "cameras":
                cameras = tuple(value.strip("\"'").split())
    return ClientKey(path.name[: -len(".key")], public.decode(), cameras)


def load_authorized(directory: Path) -> dict[str, ClientKey]:
    """Every NAME.key in the directory by its public key; a bad file is skipped, logged."""
    keys: dict[str, ClientKey] = {}
    if not directory.is_dir():
        return keys
    for path in sorted(directory.glob("*.key")):
        try:
            key = read_key(path)
        except UserError as exc:
            log.warning("curve_key_skipped", error=str(exc))
            continue
        keys[key.public] = key
    return keys


# ------------------------------------------------------------------------------ the handler

class Curve:
    """The ROUTER's CURVE server side and its ZAP handler thread."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], config: Config) -> None:
        self.directory = authorized_dir(config)
        self.public, self._secret = server_keypair(keys_dir(config))
        self.keys: dict[str, ClientKey] = {}  # swapped whole on reload: readers need no lock
        # Refused handshakes, from the ZAP handler (unknown keys) and from the sockets'
        # monitors (no keys, a wrong server key: server/handshakes.py); its count is the
        # stats reply's curve.denied.
        self.refusals = Refusals("curve_denied", "denied")
        self.dropped = 0  # requests refused: their connection's key was revoked since
        self._stop = threading.Event()
        self._zap = ctx.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)  # before any connection: none is let in unchecked
        self.reload()
        self._thread = threading.Thread(target=self._run, name="zap", daemon=True)
        self._thread.start()

    def secure(self, router: zmq.Socket[bytes]) -> None:
        router.setsockopt(zmq.CURVE_SERVER, 1)
        router.setsockopt(zmq.CURVE_SECRETKEY, self._secret)
        router.setsockopt(zmq.ZAP_DOMAIN, b"stgcnd")

    def reload(self) -> None:
        self.keys = load_authorized(self.directory)
        log.info("curve_keys", directory=str(self.directory), clients=len(self.keys),
                 server_key=self.public.decode())
        if not self.keys:
            log.warning("curve_no_clients", directory=str(self.directory),
                        action="every client is refused; add one with `stgcnd keys create`")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
        self._zap.close(0)

    def _run(self) -> None:
        name_os_thread("stgcnd-zap")
        zap = self._zap
        while not self._stop.is_set():
            if not zap.poll(POLL_MS):
                continue
            request = zap.recv_multipart()
            try:
                answer = self._answer(request)
            except Exception as exc:  # never leave libzmq waiting for an answer
                log.error("curve_zap_error", error=f"{type(exc).__name__}: {exc}")
                answer = [b"1.0", request[1] if len(request) > 1 else b"", b"500",
                          b"internal error", b"", b""]
            zap.send_multipart(answer)

    def _answer(self, request: list[bytes]) -> list[bytes]:
        # RFC 27: version, request id, domain, address, routing id, mechanism, credentials
        if len(request) < 6:
            return [b"1.0", request[1] if len(request) > 1 else b"", b"400", b"malformed",
                    b"", b""]
        version, req_id, _domain, address, _routing, mechanism = request[:6]
        if mechanism != b"CURVE":  # other sockets of the context (NULL): not ours to judge
            return [version, req_id, b"200", b"OK", b"", b""]
        public = z85.encode(request[6]).decode() if len(request) > 6 else ""
        key = self.keys.get(public)
        if key is None:
            peer = address.decode(errors="replace")
            self.refusals.refused(UNKNOWN_KEY, f"ip:{peer}" if peer else "", address=peer,
                                  client_key=public)
            return [version, req_id, b"400", b"unknown key", b"", b""]
        return [version, req_id, b"200", b"OK", public.encode(), b""]
