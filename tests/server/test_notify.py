"""The notify protocol against a real datagram socket (path and abstract namespace)."""

from __future__ import annotations

import os
import socket

from stgcnd.server.notify import Notifier


def _recv(sock: socket.socket) -> dict[str, str]:
    sock.settimeout(2)
    return dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())


def test_path_socket(tmp_path):
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "3000000",
                      "WATCHDOG_PID": str(os.getpid())})
        assert n.enabled and n.watchdog_interval == 1.5
        assert n.ready("serving x")
        assert _recv(sock) == {"READY": "1", "STATUS": "serving x"}
        n.reloading()
        msg = _recv(sock)
        assert msg["RELOADING"] == "1" and int(msg["MONOTONIC_USEC"]) > 0
        n.extend_timeout(60)
        assert _recv(sock) == {"EXTEND_TIMEOUT_USEC": "60000000"}
        n.watchdog()
        assert _recv(sock) == {"WATCHDOG": "1"}
        n.stopping()
        assert _recv(sock)["STOPPING"] == "1"
        n.close()


def test_abstract_socket():
    name = f"stgcnd-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.status("hello")
        assert _recv(sock) == {"STATUS": "hello"}


def test_disabled_without_socket_and_watchdog_for_other_pid():
    n = Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert not n.enabled and not n.ready("x") and n.watchdog_interval is None
