"""Who a connection belongs to (server/peers.py): a process for ipc, an address for remote
tcp, a user for the loopback; per connection where nothing better can be known."""

from __future__ import annotations

import socket

import pytest

from stgcnd.server.peers import accepted_peer, loopback_uid, peer_key


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
        if loopback_uid(socket.AF_INET, a.getpeername(), a.getsockname()) is None:
            pytest.skip("NETLINK_SOCK_DIAG (inet_diag) is not available here: loopback tcp "
                        "peers fall back to one per connection")
        key_a, key_b = accepted_peer(a.fileno()), accepted_peer(b.fileno())
        assert key_a is not None and key_b is not None
        assert key_a[0] == key_b[0] == f"uid:{__import__('os').getuid()}"
        assert key_a[1] != key_b[1]  # the inodes of two sockets
        # A message's metadata names the same peer, found by fd (Connections.loopback).
        loopback = {a.fileno(): key_a[0]}
        assert peer_key("127.0.0.1", a.fileno(), loopback) == key_a[0]
        assert peer_key("127.0.0.1", 999_999, loopback) == "fd:999999"  # unknown: per fd
        assert peer_key("10.0.0.5", a.fileno(), loopback) == "ip:10.0.0.5"
    finally:
        for s in kept:
            s.close()
