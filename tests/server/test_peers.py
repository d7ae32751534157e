"""Who a connection belongs to (server/peers.py): a process for ipc, an address for remote
tcp, a process for the loopback where /proc shows it (else its user); per connection where
nothing better can be known."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from stgcnd.server.peers import accepted_peer, loopback_owner, peer_key
from stgcnd.server.socket_owners import SocketOwners


def test_peer_keys_lump_only_what_is_one_client():
    assert peer_key("localhost:1000:1000:4242", 7) == "pid:4242"
    assert peer_key("10.0.0.7", 7) == "ip:10.0.0.7"
    # Another pid namespace (pid 0), the loopback and an unknown address: per connection.
    for address in ("localhost:0:0:0", "127.0.0.1", "::1", ""):
        assert peer_key(address, 7) == "fd:7"


def _tcp_pair_factory():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    kept = [srv]

    def connect() -> socket.socket:
        client = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
        kept.extend((client, conn))
        return conn

    return connect, kept


def test_loopback_tcp_connections_of_one_process_are_one_peer():
    connect, kept = _tcp_pair_factory()
    try:
        a, b = connect(), connect()
        if loopback_owner(socket.AF_INET, a.getpeername(), a.getsockname()) is None:
            pytest.skip("NETLINK_SOCK_DIAG (inet_diag) is not available here: loopback tcp "
                        "peers fall back to one per connection")
        key_a, key_b = accepted_peer(a.fileno()), accepted_peer(b.fileno())
        assert key_a is not None and key_b is not None
        assert key_a[0] == key_b[0] == f"pid:{os.getpid()}"
        assert key_a[1] != key_b[1]  # the inodes of two sockets
        # A message's metadata names the same peer, found by fd (Connections.loopback).
        loopback = {a.fileno(): key_a[0]}
        assert peer_key("127.0.0.1", a.fileno(), loopback) == key_a[0]
        assert peer_key("127.0.0.1", 999_999, loopback) == "fd:999999"  # unknown: per fd
        assert peer_key("10.0.0.5", a.fileno(), loopback) == "ip:10.0.0.5"
    finally:
        for s in kept:
            s.close()


CONNECT = """
import socket, sys
client = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("connected", flush=True)
sys.stdin.read()
"""


def test_loopback_tcp_connections_of_two_processes_of_one_user_are_two_peers():
    """Issue #41: keyed by user, a process holding every slot with cameras it got served
    locked out the cameras of every other process of its user."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    other = subprocess.Popen([sys.executable, "-c", CONNECT, str(srv.getsockname()[1])],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    mine = socket.create_connection(srv.getsockname())
    try:
        assert other.stdout.readline().strip() == "connected"
        conns = [srv.accept()[0] for _ in range(2)]
        if loopback_owner(socket.AF_INET, conns[0].getpeername(),
                          conns[0].getsockname()) is None:
            pytest.skip("NETLINK_SOCK_DIAG (inet_diag) is not available here")
        keys = {accepted_peer(c.fileno())[0] for c in conns}  # type: ignore[index]
        assert keys == {f"pid:{os.getpid()}", f"pid:{other.pid}"}
        for c in conns:
            c.close()
    finally:
        other.stdin.close()
        other.wait(10)
        mine.close()
        srv.close()


def test_socket_owners_scan_within_their_budget():
    a, b = socket.socketpair()
    try:
        # A scan stops after SCAN_MAX_S; on a loaded machine with many processes of this
        # user that may come before this one, so the test gives its scans all the time.
        owners = SocketOwners(scan_max_s=60.0)
        inode = os.fstat(a.fileno()).st_ino
        assert owners.process(inode, os.getuid()) == os.getpid()
        assert owners.process(os.fstat(b.fileno()).st_ino, os.getuid()) == os.getpid()
        assert owners.scans == 1  # the first scan saw both
        assert owners.process(inode, os.getuid() + 1) == os.getpid()  # remembered
        assert SocketOwners(scan_max_s=60.0).process(inode, os.getuid() + 1) is None
        spent = SocketOwners(budget_s=0.0, scan_max_s=60.0)
        assert spent.process(inode, os.getuid()) == os.getpid()  # the first scan is free
        assert spent.process(1, os.getuid()) is None and spent.over_budget == 1
        assert SocketOwners(proc="/nonexistent").process(inode, os.getuid()) is None
    finally:
        a.close()
        b.close()
