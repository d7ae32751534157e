"""A peer that speaks ZMTP 3.0 on a raw socket, as an attacker that does not use libzmq would:
a NULL-mechanism handshake as a DEALER, then frames of its choosing.

Run as a script: `python raw_zmtp.py ENDPOINT SECONDS [SOCKET_TYPE [FRAME_BYTES]]` sends frames
(1 MiB unless FRAME_BYTES) that all say "more follows" for SECONDS (a message that never ends),
as a DEALER unless SOCKET_TYPE (SUB for the events socket), then reports how far it got.
"""

from __future__ import annotations

import socket
import struct
import sys
import time

MORE, LONG, COMMAND = 0x01, 0x02, 0x04


def connect(endpoint: str, socket_type: bytes = b"DEALER") -> socket.socket:
    scheme, address = endpoint.split("://", 1)
    if scheme == "ipc":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
    else:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
    greeting = (b"\xff" + bytes(8) + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00")
                + bytes(32))  # as-server 0, then filler
    sock.sendall(greeting)
    got = b""
    while len(got) < 64:
        part = sock.recv(64 - len(got))
        if not part:
            raise ConnectionError("the daemon closed the connection during the greeting")
        got += part
    name, value = b"Socket-Type", socket_type
    body = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    sock.sendall(bytes([COMMAND, len(body)]) + body)
    return sock


def frame(body: bytes, more: bool) -> bytes:
    flags = MORE if more else 0
    if len(body) > 255:
        return bytes([flags | LONG]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def _exactly(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        part = sock.recv(n - len(got))
        if not part:
            raise ConnectionError("the daemon closed the connection")
        got += part
    return got


def read_message(sock: socket.socket) -> list[bytes]:
    """The next message's frames, the daemon's commands (its READY) skipped."""
    frames: list[bytes] = []
    while True:
        flags, size = _exactly(sock, 2)
        if flags & LONG:
            size = struct.unpack(">Q", bytes([size]) + _exactly(sock, 7))[0]
        body = _exactly(sock, size) if size else b""
        if flags & COMMAND:
            continue
        frames.append(body)
        if not flags & MORE:
            return frames


def main() -> None:
    endpoint, seconds = sys.argv[1], float(sys.argv[2])
    socket_type = sys.argv[3].encode() if len(sys.argv) > 3 else b"DEALER"
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 20
    sock = connect(endpoint, socket_type)
    # Whole MiB a send, whatever the frame size.
    chunk = frame(b"x" * size, more=True) * max((1 << 20) // size, 1)
    print("sending", flush=True)
    sent, end = 0, time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            sock.sendall(chunk)
            sent += 1
    except OSError as exc:
        print(f"closed after {sent} MiB: {exc}", flush=True)
        return
    print(f"sent {sent} MiB", flush=True)


if __name__ == "__main__":
    main()
