"""`stgcnd camera-sim` when things go wrong: one line per cause, errors counted, exit non-zero.

The command runs as a real subprocess; where a daemon must answer, a real ROUTER socket in this
process plays one (the fake daemon of the client tests), so no model has to load.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stgcnd_client.protocol import encode_reply
from tests.clients.client_fakes import FakeDaemon, FakeModelServer
from tests.conftest import REPO


def camera_sim_args(endpoint: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "stgcnd", "camera-sim", "--endpoint", endpoint, "--json", *args]


def camera_sim(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(camera_sim_args(endpoint, *args), capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def rows_of(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def short_dir(tmp_path: Path) -> Path:
    return tmp_path if len(str(tmp_path)) < 80 else Path("/tmp")


@pytest.fixture(scope="module", autouse=True)
def nobody_listening_started(tmp_path_factory):
    """camera-sim with nothing listening, on ipc and on tcp: each waits out its cameras' 5 s
    timeout, so both start with this module's first test and run beside the others (the tests
    that read them come last)."""
    import socket

    tmp = tmp_path_factory.mktemp("nobody")
    short = tmp if len(str(tmp)) < 80 else Path("/tmp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nobody listens there
    runs = {"ipc": (f"ipc://{short / 'nobody-here.sock'}", "3"),
            "tcp": (f"tcp://127.0.0.1:{port}", "2")}
    procs = {name: (endpoint, subprocess.Popen(
        camera_sim_args(endpoint, "--cameras", cameras, "--duration", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO))
        for name, (endpoint, cameras) in runs.items()}
    yield procs
    for _, proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def nobody_listening(nobody_listening_started
                     ) -> dict[str, tuple[str, subprocess.CompletedProcess]]:
    done = {}
    for name, (endpoint, proc) in nobody_listening_started.items():
        out, err = proc.communicate(timeout=120)
        done[name] = (endpoint, subprocess.CompletedProcess(proc.args, proc.returncode, out,
                                                            err))
    return done


@pytest.mark.parametrize(("endpoint", "says"), [
    ("/tmp/x.sock", "did you mean ipc:///tmp/x.sock?"),
    ("tcp://localhost:notaport", "expected tcp://HOST:PORT"),
    ("tcp://*:5555", "connect to the daemon's address"),
    ("inproc://x", "inproc:// exists only inside one process"),
])
def test_malformed_endpoint_fails_at_once(endpoint, says):
    start = time.monotonic()
    proc = camera_sim(endpoint)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stgcnd camera-sim: error: ")
    assert says in lines[0]
    assert time.monotonic() - start < 10  # no camera waited for a timeout


def test_unknown_model_names_the_served_ones(short_dir):
    endpoint = f"ipc://{short_dir / 'fake-daemon.sock'}"
    daemon = FakeDaemon(endpoint, FakeModelServer()).start()
    try:
        proc = camera_sim(endpoint, "--cameras", "2", "--duration", "1", "--model", "nope")
    finally:
        daemon.stop()
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "2 cameras: the daemon serves no model 'nope' (it serves: single); pass one of those to "
        "--model"]


def test_request_errors_are_grouped_by_cause_with_their_count(short_dir):
    endpoint = f"ipc://{short_dir / 'busy-daemon.sock'}"
    model = FakeModelServer()

    def busy_on_push(req):
        if req.op == "push" and req.camera == "cam2":
            return [encode_reply(req.id, error=("busy", "the camera's queue is full"))]
        return model(req)

    daemon = FakeDaemon(endpoint, busy_on_push).start()
    try:
        proc = camera_sim(endpoint, "--cameras", "2", "--duration", "3", "--fps", "20")
    finally:
        daemon.stop()
    assert proc.returncode == 1
    rows = rows_of(proc)
    assert rows[0]["errors"] == 0 and rows[0]["replies"] > 10
    assert rows[1]["errors"] > 10 and rows[1]["replies"] == 0
    assert proc.stderr.strip().splitlines() == [
        f"cam2: the daemon answered busy: the camera's queue is full ({rows[1]['errors']} "
        "requests)"]


def test_nothing_listening_is_one_line_for_all_cameras(nobody_listening):
    endpoint, proc = nobody_listening["ipc"]
    short_dir = Path(endpoint[len("ipc://"):]).parent
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().splitlines() == [
        f"3 cameras: no daemon answered at {endpoint} within 5 s: {short_dir / 'nobody-here.sock'}"
        " does not exist (is `stgcnd serve` running? its \"ready\" log line names the endpoint "
        "it listens on)"]
    rows = rows_of(proc)
    assert [r["errors"] for r in rows] == [1, 1, 1]
    table = [line.split() for line in proc.stdout.splitlines() if line.split()[0][3:].isdigit()]
    assert [int(row[7]) for row in table] == [1, 1, 1]  # the errors column (after compute ms)


def test_nothing_listening_on_tcp(nobody_listening):
    endpoint, proc = nobody_listening["tcp"]
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"2 cameras: no daemon answered at {endpoint} within 5 s (is `stgcnd serve` "
        "running? its \"ready\" log line names the endpoint it listens on)"]
