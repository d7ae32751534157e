"""A client that cannot reach the daemon says why it may be, by transport (issue #32, item 7).

A daemon with CURVE on refuses a client without keys during ZeroMQ's handshake: the client
can never send, which looks exactly like no daemon at all. Over tcp without keys the message
names the Client arguments for keys and `stgcnd keys create`. Real sockets: a ROUTER that is
a CURVE server, as the daemon's is."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import zmq

from stgcnd_client import Client, Timeout
from tests.curve_router import curve_server_router


@pytest.fixture
def curve_router() -> Iterator[tuple[str, bytes]]:
    """(endpoint, public key) of a CURVE-server ROUTER on the loopback."""
    ctx = zmq.Context()
    router, public = curve_server_router(ctx)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    yield f"tcp://127.0.0.1:{port}", public
    router.close(0)
    ctx.term()


def test_no_keys_on_a_curve_endpoint_says_keys_may_be_needed(curve_router):
    endpoint, _ = curve_router
    with Client(endpoint, timeout=0.5, retries=0) as client, \
            pytest.raises(Timeout, match="could not reach") as info:
        client.ping()
    message = str(info.value)
    for named in ("may need CURVE keys", "server_key=", "client_key=", "stgcnd keys create",
                  "docs/remote-cameras.md"):
        assert named in message, message


def test_keys_the_daemon_refuses_say_what_to_check(curve_router):
    endpoint, _ = curve_router
    wrong_server, _ = zmq.curve_keypair()  # not this daemon's public key
    mine = tuple(k.decode() for k in zmq.curve_keypair())
    with Client(endpoint, timeout=0.5, retries=0, server_key=wrong_server.decode(),
                client_key=mine) as client, pytest.raises(Timeout) as info:
        client.ping()
    assert "is server_key its public key" in str(info.value)
    assert "stgcnd keys list" in str(info.value)


def test_nothing_listening_over_ipc_keeps_the_socket_question(endpoint):
    with Client(endpoint, timeout=0.3, retries=0) as client, \
            pytest.raises(Timeout, match="may this process open its socket") as info:
        client.ping()
    assert "CURVE" not in str(info.value)


def test_nothing_listening_over_tcp_mentions_keys_too():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"tcp://127.0.0.1:{port}", timeout=0.3, retries=0) as client, \
            pytest.raises(Timeout, match="is the daemon running and listening there"):
        client.ping()
