"""check_endpoint: a wrong endpoint fails before start-up, in one line that says how to fix it."""

from __future__ import annotations

import json
import os
import re
import socket
import time

import pytest
import zmq

from stgcnd.errors import UserError
from stgcnd.server.transport import SUN_PATH_MAX, check_endpoint, parse_endpoint
from tests.conftest import REPO


def _free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("endpoint", "says"), [
    ("/tmp/x.sock", "did you mean ipc:///tmp/x.sock?"),
    ("ipc:/tmp/x.sock", "did you mean ipc:///tmp/x.sock?"),
    ("localhost:5555", "did you mean tcp://localhost:5555?"),
    ("inproc://stgcnd", "inproc:// exists only inside one process"),
    ("udp://127.0.0.1:5555", "unsupported scheme 'udp://'"),
    ("ipc://", "needs a socket path"),
    ("tcp://127.0.0.1", "expected tcp://HOST:PORT"),
    ("tcp://*:*", "port must be a number from 1 to 65535"),
    ("tcp://127.0.0.1:0", "port must be a number from 1 to 65535"),
    ("tcp://127.0.0.1:65536", "port must be a number from 1 to 65535"),
    ("tcp://192.0.2.1:5555", "not an address of this machine"),
    ("", "endpoint is empty"),
])
def test_malformed_endpoints(endpoint, says):
    with pytest.raises(UserError, match=re.escape(says)):
        check_endpoint(endpoint)




def test_good_endpoints_pass_and_leave_nothing_behind(tmp_path):
    sock = tmp_path / "new" / "dir" / "d.sock"
    check_endpoint(f"ipc://{sock}")
    assert sock.parent.is_dir() and not sock.exists()
    check_endpoint(f"tcp://127.0.0.1:{_free_tcp_port()}")
    check_endpoint(f"tcp://*:{_free_tcp_port()}")


def test_ipc_path_length_is_checked(tmp_path):
    room = SUN_PATH_MAX - len(os.fsencode(str(tmp_path))) - 1
    fits = tmp_path / ("s" * room)
    check_endpoint(f"ipc://{fits}")
    with pytest.raises(UserError, match=f"is {SUN_PATH_MAX + 1} bytes.*at most {SUN_PATH_MAX}"):
        check_endpoint(f"ipc://{fits}x")


def test_ipc_directory_that_cannot_exist(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="cannot create the socket's directory"):
        check_endpoint(f"ipc://{tmp_path / 'file' / 'd.sock'}")
    with pytest.raises(UserError, match="exists and is not a socket"):
        check_endpoint(f"ipc://{tmp_path / 'file'}")


def test_something_already_listening(tmp_path):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    try:
        router.bind(f"ipc://{tmp_path / 'd.sock'}")
        with pytest.raises(UserError, match="another process is listening"):
            check_endpoint(f"ipc://{tmp_path / 'd.sock'}")
        port = _free_tcp_port()
        router.bind(f"tcp://127.0.0.1:{port}")
        with pytest.raises(UserError, match="another process is listening on that port"):
            check_endpoint(f"tcp://127.0.0.1:{port}")
    finally:
        router.close()
        ctx.term()
    # a killed daemon's socket file: nobody answers, so it is no obstacle
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "stale.sock"))
    stale.close()
    check_endpoint(f"ipc://{tmp_path / 'stale.sock'}")


def test_client_side_parsing_refuses_the_wildcard_host():
    assert parse_endpoint("tcp://*:5555", listening=True) == ("tcp", "*:5555")
    with pytest.raises(UserError, match="connect to the daemon's address"):
        parse_endpoint("tcp://*:5555", listening=False)


def test_serve_with_a_bare_path_fails_at_once(stgcnd_main):
    start = time.monotonic()
    proc = stgcnd_main("serve", "--endpoint", "/tmp/x.sock", env={"STGCND_CONFIG": ""},
                       cwd=REPO)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    message = ("'/tmp/x.sock' is not a ZeroMQ endpoint: did you mean ipc:///tmp/x.sock?")
    # One JSON event on the daemon's log stream (journald readers filter on it); the human
    # line on stderr only where a person reads it (not JSON, or a terminal).
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(e["event"], e["error"]) for e in events] == [("startup_failed", message)]
    assert proc.stderr.strip() in ("", f"stgcnd serve: error: {message}")
    assert not any(e.get("event") == "model_loaded" for e in events)  # nothing was loaded
    # Loading the demo model alone takes longer than this on this machine.
    assert elapsed < 5.0, elapsed


def test_an_abstract_ipc_endpoint_binds_without_a_file():
    """`ipc://@name` (Linux abstract namespace): no socket file to prepare, chmod or unlink."""
    from stgcnd.server.transport import bind_endpoint

    endpoint = f"ipc://@stgcnd-unit-{os.getpid()}-{time.monotonic_ns()}"
    check_endpoint(endpoint)
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        assert bind_endpoint(router, endpoint, 0o660, "cannot listen", "fix it") is None
        with pytest.raises(UserError, match="another process is listening"):
            check_endpoint(endpoint)
        dealer.connect(endpoint)
        dealer.send(b"hi")
        assert router.poll(5000) and router.recv_multipart()[1] == b"hi"
    finally:
        dealer.close(0)
        router.close(0)
        ctx.term()
    assert not os.path.exists(endpoint[len("ipc://"):])
