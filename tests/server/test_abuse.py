"""Abusive clients against a real `stgcnd serve` (issue #12 item 1): a peer that sends and never
reads, a client SIGKILLed mid-request, connection churn. Well-behaved cameras must keep getting
replies within a bound, and SIGTERM must stop the daemon within its drain bound.

Every daemon a test starts is stopped by pid at teardown (SIGTERM, SIGKILL after a bound), even
when the daemon is wedged: today's daemon blocks in send_multipart on a full peer, so the
slow-reader test fails (by timeout, clearly) until the serving core drops such replies.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest
import zmq

from stgcnd_client import Client, ServerError, Timeout
from stgcnd_client.wire import decode_reply, encode_request
from tests.conftest import REPO
from tests.server.daemon_harness import FRAMES, Daemon, process_stats, stop_by_pid

pytestmark = pytest.mark.slow

GOOD_CLIENTS = 3
# A well-behaved camera's every call must be answered within this. A daemon that blocks on a
# full peer stalls everyone for the whole abuse (ABUSE_SECONDS), which this still catches; 2 s
# did not leave room for the CPU the flood takes from the device work: on Python 3.8 (torch
# 2.0.1, 2 cores) a batch of three 30-frame windows took 816 ms during the flood (76 ms a
# window alone), and one infer went unanswered over its two attempts in 2 s.
CALL_BOUND_S = 3.0
ABUSE_MESSAGES = 20_000
ABUSE_SECONDS = 4.0
DRAIN_BOUND_S = 12.0        # drain_timeout (10 s) + 2 s, as in test_daemon


@pytest.fixture
def daemon(tmp_path):
    made: list[Daemon] = []

    def start(**config: object) -> Daemon:
        d = Daemon(tmp_path, reuse_engines=True, **config).start()
        made.append(d)
        return d

    yield start
    for d in made:
        stop_by_pid(d, term_timeout=10.0)


class GoodCameras:
    """Cameras in threads calling ping and infer in a loop; every call timed and checked."""

    def __init__(self, endpoint: str, count: int = GOOD_CLIENTS) -> None:
        self.endpoint = endpoint
        self.stop = threading.Event()
        self.calls = Counter()
        self.failures: list[str] = []
        self.slowest = 0.0
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._camera, args=(i,), daemon=True)
                        for i in range(count)]

    def __enter__(self) -> GoodCameras:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(CALL_BOUND_S * 2 + 5)

    def _camera(self, i: int) -> None:
        window = np.random.default_rng(i).random((3, FRAMES, 33, 1), dtype=np.float32)
        with Client(self.endpoint, camera_id=f"good-{i}", timeout=CALL_BOUND_S,
                    retries=1) as c:
            while not self.stop.is_set():
                for call in (c.ping, lambda: c.infer(window)):
                    t0 = time.monotonic()
                    try:
                        call()
                        outcome = "ok"
                    except ServerError as exc:
                        outcome = exc.code  # busy/expired are answers; only silence fails
                    except Timeout as exc:
                        outcome = "timeout"
                        with self._lock:
                            self.failures.append(f"good-{i}: {exc}")
                    took = time.monotonic() - t0
                    with self._lock:
                        self.calls[outcome] += 1
                        self.slowest = max(self.slowest, took)
                time.sleep(0.01)

    def snapshot(self) -> tuple[int, int]:
        """(calls answered, calls that went unanswered) so far."""
        with self._lock:
            return sum(self.calls.values()) - self.calls["timeout"], len(self.failures)

    def served_within(self, seconds: float) -> int:
        """Calls answered during the next `seconds`."""
        before, _ = self.snapshot()
        time.sleep(seconds)
        return self.snapshot()[0] - before


def abuse(endpoint: str, op: str) -> dict[str, int]:
    """A DEALER that sends `op` in a loop with NOBLOCK and never reads; bounded by count and
    time. Returns how many messages it got out."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    frame = np.zeros((3, 33, 1), np.float32)
    sent = refused = 0
    end = time.monotonic() + ABUSE_SECONDS
    try:
        for i in range(ABUSE_MESSAGES):
            if time.monotonic() > end:
                break
            arrays = [frame] if op == "push" else []
            try:
                s.send_multipart(encode_request(op, i + 1, "abuser", arrays=arrays), zmq.NOBLOCK)
                sent += 1
            except zmq.Again:  # our own queue is full: the daemon is not taking them in
                refused += 1
                time.sleep(0.001)
    finally:
        s.close(0)  # disconnects without ever having read a reply
    return {"sent": sent, "refused": refused}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("op", ["ping", "push"])
def test_a_peer_that_never_reads_cannot_stall_other_cameras(daemon, op):
    d = daemon()
    with GoodCameras(d.endpoint) as good:
        assert good.served_within(1.0) > 0, "the good cameras were not served before the abuse"
        counts = abuse(d.endpoint, op)
        after = good.served_within(2.0)  # the abuser is gone
        _, failures = good.snapshot()
    assert counts["sent"] > 0
    assert not good.failures and after > 0, (
        f"after a peer sent {counts['sent']} {op} requests without reading any reply, "
        f"well-behaved cameras got {after} replies in 2 s once it left and {failures} calls "
        f"went unanswered within {CALL_BOUND_S} s, e.g. {good.failures[:2]}: the daemon blocks "
        "sending to a full peer (issue #12 item 1)")
    assert good.slowest <= CALL_BOUND_S + 0.5, good.slowest
    assert d.proc.poll() is None, "the daemon died"
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    try:
        code = d.proc.wait(timeout=DRAIN_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"SIGTERM did not stop the daemon within {DRAIN_BOUND_S} s after the abuse")
    assert code == 0 and time.monotonic() - t0 < DRAIN_BOUND_S


CHILD = """
import sys, numpy as np, zmq
sys.path.insert(0, {clients!r})
from stgcnd_client.wire import encode_request

s = zmq.Context.instance().socket(zmq.DEALER)
s.connect({endpoint!r})
w = np.random.rand(3, {frames}, 33, 1).astype("float32")
f = np.random.rand(3, 33, 1).astype("float32")
for i in range(1, 41):  # pipelined: many requests outstanding when the kill comes
    s.send_multipart(encode_request("infer", i, "victim", arrays=[w]))
    s.send_multipart(encode_request("push", 1000 + i, "victim", arrays=[f]))
print("go", flush=True)
while True:
    s.recv_multipart()
"""


@pytest.mark.timeout(180)
def test_client_killed_mid_request_leaves_the_daemon_serving(daemon):
    d = daemon()
    code = CHILD.format(clients=str(REPO / "clients"), endpoint=d.endpoint, frames=FRAMES)
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        try:
            assert child.stdout.readline().strip() == b"go"
            time.sleep(0.2)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
    with Client(d.endpoint, camera_id="survivor", timeout=10) as c:
        c.ping()
        c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
        c.push(np.zeros((3, 33, 1), np.float32))
        # The victim's session is still there and consistent: a new client may take it over.
    with Client(d.endpoint, camera_id="victim", timeout=10) as c:
        c.reset()
        assert c.push(np.zeros((3, 33, 1), np.float32)) is None
    assert d.proc.poll() is None
    assert d.stop() == 0


@pytest.mark.timeout(180)
def test_connection_churn_is_served_and_leaks_nothing(daemon):
    d = daemon()
    ctx = zmq.Context.instance()
    with Client(d.endpoint, camera_id="warm") as c:
        c.ping()
    time.sleep(0.5)
    start = process_stats(d.proc.pid)
    connections, answered, deadline = 600, 0, time.monotonic() + 30
    for i in range(connections):
        if time.monotonic() > deadline:
            break
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(d.endpoint)
        op = ("ping", "hello", "stats")[i % 3]
        s.send_multipart(encode_request(op, i, f"churn-{i % 7}"))
        if s.poll(5000):
            reply = decode_reply(s.recv_multipart())
            answered += reply.ok and reply.id == i
        s.close(0)
    assert answered == i + 1, f"{answered} of {i + 1} connections got their reply"
    assert answered >= 200, f"only {answered} connections within the time bound"
    time.sleep(1.0)  # let the daemon see the disconnects
    end = process_stats(d.proc.pid)
    assert end["fds"] <= start["fds"] + 10, (start, end)
    assert end["threads"] <= start["threads"] + 2, (start, end)
    assert d.stop() == 0
