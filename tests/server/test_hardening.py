"""Hardening II (issue #24) against a real `stgcnd serve`: no peer can stop the daemon, stall
the other cameras or lock them out. Each attack runs while a well-behaved camera (the real
client library, 25 windows a second) is timed; every daemon is stopped by pid.

The model is the noop backend with 1 ms of simulated compute: what is measured is the daemon
and its transport, not the network (which would dominate on this CPU).
"""

from __future__ import annotations

import json
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from stgcnd_client import Client, ServerError, Timeout
from stgcnd_client.wire import decode_reply, encode_request
from tests.conftest import REPO
from tests.server.daemon_harness import FRAMES, Daemon, process_stats, stop_by_pid

pytestmark = pytest.mark.slow

NOOP = (f'[[models]]\nname = "demo"\nbackend = "noop"\ndemo = true\nframes = {FRAMES}\n'
        'noop_compute_us = 1000\n')


@pytest.fixture
def daemon(tmp_path):
    made: list[Daemon] = []

    def start(fd_limit: int | None = None, endpoint: str | None = None,
              **config: object) -> Daemon:
        d = Daemon(tmp_path, endpoint=endpoint, models=NOOP, **config)
        d.fd_limit = fd_limit
        made.append(d.start())
        return d

    yield start
    for d in made:
        stop_by_pid(d, term_timeout=15.0)


class Camera(threading.Thread):
    """A camera sending a window every 40 ms; every call timed, every failure kept."""

    def __init__(self, endpoint: str, name: str = "real", retries: int = 2) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.name, self.retries = endpoint, name, retries
        self.stop = threading.Event()
        self.latencies: list[tuple[float, float]] = []  # (start, seconds)
        self.failures: list[str] = []

    def run(self) -> None:
        window = np.random.default_rng(0).random((3, FRAMES, 33, 1), dtype=np.float32)
        with Client(self.endpoint, camera_id=self.name, timeout=5.0,
                    retries=self.retries) as c:
            next_at = time.monotonic()
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    c.infer(window)
                    self.latencies.append((t0, time.monotonic() - t0))
                except (ServerError, Timeout) as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                next_at += 0.04
                time.sleep(max(next_at - time.monotonic(), 0))

    def window(self, start: float, end: float) -> list[float]:
        return [s for t, s in self.latencies if start <= t <= end]

    def longest_wait(self, start: float, end: float) -> float:
        """The longest time without a reply between `start` and `end` (failed calls, which
        `window` leaves out, count as waiting)."""
        done = sorted(t + s for t, s in self.latencies if start <= t + s <= end)
        marks = [start, *done, end]
        return max(b - a for a, b in zip(marks, marks[1:]))

    def __enter__(self) -> Camera:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(10)


class Newcomers(threading.Thread):
    """New connections, one after another, each sending one ping and waiting for its reply
    (what a camera restarting, or a tool, does): every one must be answered."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.endpoint = endpoint
        self.stop = threading.Event()
        self.answered = 0
        self.unanswered = 0

    def run(self) -> None:
        ctx = zmq.Context.instance()
        i = 0
        while not self.stop.is_set():
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(self.endpoint)
            try:
                s.send_multipart(encode_request("ping", i, f"newcomer-{i}"))
                if s.poll(5000):
                    s.recv_multipart()
                    self.answered += 1
                else:
                    self.unanswered += 1
            finally:
                s.close()
            i += 1
            time.sleep(0.005)

    def __enter__(self) -> Newcomers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(10)


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99))


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_own_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the test needs {need} fds for its own sockets; the hard limit is {hard}")
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def log_text(d: Daemon) -> str:
    return d.log_path.read_text(errors="replace")


# ------------------------------------------------------------------ 1. idle connections
@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_more_idle_connections_than_fds_cannot_stop_the_daemon(daemon, transport):
    idle = 1100
    raise_own_fd_limit(2 * idle + 512)  # a DEALER holds two fds here: its mailbox and link
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}" if transport == "tcp" else None
    d = daemon(fd_limit=1024, endpoint=endpoint)
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, idle + 64)
    socks = []
    try:
        with Camera(d.endpoint) as cam:
            time.sleep(1.0)
            t0 = time.monotonic()
            for _ in range(idle):
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.connect(d.endpoint)
                socks.append(s)
            time.sleep(5.0)  # held open (ZeroMQ reconnects those the daemon closes)
            during = cam.window(t0, time.monotonic())
            assert d.proc.poll() is None, "the daemon died:\n" + log_text(d)[-3000:]
            with Client(d.endpoint, camera_id="newcomer", timeout=5.0) as c:
                stats = c.stats()  # a new client still gets in
        print(f"\n{transport}: camera p99 {p99(during) * 1e3:.1f} ms, max "
              f"{max(during) * 1e3:.1f} ms over {len(during)} calls; {stats['connections']}")
        assert not cam.failures, cam.failures[:3]
        assert len(during) > 50 and p99(during) < 0.050, (
            f"the camera's p99 was {p99(during) * 1e3:.1f} ms during the flood")
        conns = stats["connections"]
        assert conns["connections"] <= conns["cap"] + 64 and conns["closed_idle"] > 0, conns
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    text = log_text(d)
    assert "Assertion" not in text and "Too many open files" not in text
    assert '"event": "fd_limit"' in text
    assert d.stop() == 0


# ------------------------------------------------------------------ 2. many frames
# Dropped after it arrived (about 9 MB in libzmq's pipe: under the growth watch's 16 MB in
# 0.5 s); bigger messages are cut while they arrive (test_a_message_of_millions_of_frames...).
MANY_FRAMES = 150_000


MANY_FRAMES_ATTACK = """
import sys, zmq
sys.path.insert(0, {clients!r})
from stgcnd_client.wire import decode_reply, encode_request
s = zmq.Context.instance().socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect({endpoint!r})
print("sending", flush=True)
s.send_multipart([encode_request("ping", 7, "attacker")[0]] + [b""] * {frames})
if s.poll(30_000):
    r = decode_reply(s.recv_multipart())
    print(r.id, r.error.code if r.error else "ok", flush=True)
else:
    print("none", flush=True)
"""


@pytest.mark.timeout(240)
def test_a_message_of_many_frames_is_refused_cheaply(daemon):
    d = daemon()
    code = MANY_FRAMES_ATTACK.format(clients=str(REPO / "clients"), endpoint=d.endpoint,
                                     frames=MANY_FRAMES)
    with Camera(d.endpoint) as cam:
        time.sleep(3.0)  # two stats ticks: RSS settled
        before = process_stats(d.proc.pid)["rss_kb"]
        attack = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert attack.stdout.readline().strip() == "sending"
            t0 = time.monotonic()
            reply = attack.communicate(timeout=60)[0].split()
        finally:
            if attack.poll() is None:
                attack.kill()
                attack.wait()
        time.sleep(1.0)
        worst = max(cam.window(t0, time.monotonic()))
        time.sleep(1.5)  # the memory goes back at once (a trim, and one more a second on)
        after = process_stats(d.proc.pid)["rss_kb"]
        with Client(d.endpoint, camera_id="after") as c:
            st = c.stats()
    print(f"\nworst gap of the camera {worst * 1e3:.0f} ms; RSS {before} -> {after} kB")
    assert reply == ["7", "too-large"], reply
    assert not cam.failures, cam.failures[:3]
    assert worst < 2.0, f"the camera waited {worst:.2f} s"
    assert after - before < 20 * 1024, (before, after)
    assert st["oversized_messages"] == 1
    assert "peer_banned" in log_text(d)
    assert d.stop() == 0


HUGE_ATTACK = """
import socket, sys, time
sys.path.insert(0, {here!r})
sys.path.insert(0, {clients!r})
from raw_zmtp import connect, frame
from stgcnd_client.wire import encode_request
sock = connect({endpoint!r})
# A ping and {frames} empty frames, built as ZMTP bytes: they arrive as fast as the daemon's
# I/O thread parses them (about 64 B a frame in its pipe), not as fast as pyzmq sends.
wire = (frame(encode_request("ping", 7, "attacker")[0], more=True)
        + b"\\x01\\x00" * ({frames} - 1) + b"\\x00\\x00")
print("sending", flush=True)
try:
    sock.sendall(wire)
    sock.settimeout(30)
    while sock.recv(65536):  # a reply, if the message was taken whole; then the close
        pass
    print("closed", flush=True)
except OSError as exc:
    print("closed", exc, flush=True)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("frames", [1_000_000, 5_000_000])
def test_a_message_of_millions_of_frames_stalls_nobody(daemon, frames):
    """libzmq publishes a message to the ROUTER only once its last frame is in, and the
    ROUTER then reads nobody else's until that message's last frame is read: 5M frames kept
    the other cameras waiting 10 s. The memory watch cuts such a message while it arrives
    (its pipe grows 64 B a frame): the connection goes, libzmq frees the half message, and
    the memory goes back to the system."""
    d = daemon()
    code = HUGE_ATTACK.format(here=str(REPO / "tests" / "server"),
                              clients=str(REPO / "clients"), endpoint=d.endpoint,
                              frames=frames)
    with Camera(d.endpoint) as cam:
        time.sleep(3.0)  # two stats ticks: RSS settled
        before = process_stats(d.proc.pid)["rss_kb"]
        attack = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert attack.stdout.readline().strip() == "sending"
            t0 = time.monotonic()
            # Connections made while the message grows the heap are no part of it.
            with Newcomers(d.endpoint) as newcomers:
                out = attack.communicate(timeout=60)[0].strip()
        finally:
            if attack.poll() is None:
                attack.kill()
                attack.wait()
        # A trim at once and one more a second later; on a loaded machine the loop may come
        # to them late, so the RSS is watched for up to 10 s more rather than read once.
        time.sleep(2.5)
        deadline = time.monotonic() + 10.0
        after = process_stats(d.proc.pid)["rss_kb"]
        while after - before >= 24 * 1024 and time.monotonic() < deadline:
            time.sleep(0.25)
            after = process_stats(d.proc.pid)["rss_kb"]
        worst = cam.longest_wait(t0, time.monotonic())
        status = Path(f"/proc/{d.proc.pid}/status").read_text()
    peak = int(status.split("VmHWM:")[1].split()[0])
    print(f"\n{frames} frames: {out}; the camera's longest wait {worst * 1e3:.0f} ms; "
          f"RSS {before} -> peak {peak} -> {after} kB")
    assert out.startswith("closed"), out
    assert not cam.failures, cam.failures[:3]
    assert newcomers.answered and not newcomers.unanswered, \
        (newcomers.answered, newcomers.unanswered)
    assert worst <= 2.0, f"the camera waited {worst:.2f} s"
    assert after - before < 24 * 1024, (before, after)
    assert d.stop() == 0


PING_THEN_HUGE = """
import sys, time
sys.path.insert(0, {here!r})
sys.path.insert(0, {clients!r})
from raw_zmtp import connect, frame, read_message
from stgcnd_client.wire import decode_reply, encode_request
sock = connect({endpoint!r})
sock.sendall(frame(encode_request("ping", 7, "attacker")[0], more=False))
sock.settimeout(10)
print("pong" if decode_reply(read_message(sock)).ok else "refused", flush=True)
wire = b"\\x01\\x00" * ({frames} - 1) + b"\\x00\\x00"  # then one message of empty frames
try:
    sock.sendall(wire)
    sock.settimeout(30)
    print("answered", decode_reply(read_message(sock)).error.code, flush=True)
except (OSError, ConnectionError) as exc:
    print("closed", type(exc).__name__, flush=True)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("frames", [1_000_000, 5_000_000])
def test_a_message_of_millions_of_frames_after_a_valid_request_stalls_nobody(daemon, frames):
    """A connection that delivered a request (a ping, answered) was never cut for growth:
    its 5M-frame message completed, and its frames, dropped in order, held every other
    camera 3.8-8.1 s. Growth now also cuts a connection that delivered a request before
    while it keeps sending (bytes unread at two checks) and owes no reply. 1M frames may
    arrive whole before that and be dropped: the cameras whose requests wait behind it, or
    who sit idle, are not cut meanwhile (their requests would be lost)."""
    d = daemon()
    code = PING_THEN_HUGE.format(here=str(REPO / "tests" / "server"),
                                 clients=str(REPO / "clients"), endpoint=d.endpoint,
                                 frames=frames)
    cams = [Camera(d.endpoint, f"cam-{i}", retries=0) for i in range(3)]
    for cam in cams:
        cam.start()
    try:
        time.sleep(3.0)  # two stats ticks: RSS settled
        before = process_stats(d.proc.pid)["rss_kb"]
        attack = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert attack.stdout.readline().strip() == "pong"
            t0 = time.monotonic()
            out = attack.communicate(timeout=60)[0].strip()
        finally:
            if attack.poll() is None:
                attack.kill()
                attack.wait()
        time.sleep(2.5)  # the trims after the cut (watched for up to 10 s more: see above)
        deadline = time.monotonic() + 10.0
        after = process_stats(d.proc.pid)["rss_kb"]
        while after - before >= 24 * 1024 and time.monotonic() < deadline:
            time.sleep(0.25)
            after = process_stats(d.proc.pid)["rss_kb"]
        worst = max(cam.longest_wait(t0, time.monotonic()) for cam in cams)
    finally:
        for cam in cams:
            cam.__exit__()
    print(f"\nping, then {frames} frames: {out}; the cameras' longest wait "
          f"{worst * 1e3:.0f} ms; RSS {before} -> {after} kB")
    assert d.proc.poll() is None, "the daemon died:\n" + log_text(d)[-3000:]
    failures = [f for cam in cams for f in cam.failures]
    assert not failures, failures[:3]  # no retries: a request lost is a Timeout here
    assert after - before < 24 * 1024, (before, after)
    if frames == 1_000_000:  # cut or dropped, as it happens to arrive
        assert out.startswith(("closed", "answered too-large")), out
        return
    assert worst <= 2.0, f"a camera waited {worst:.2f} s"
    assert out.startswith("closed"), out  # cut while it arrived, never taken whole
    assert d.stop() == 0


BURST = """
import sys, zmq
sys.path.insert(0, {clients!r})
from stgcnd_client.wire import decode_reply, encode_request
ctx = zmq.Context.instance()
socks = [ctx.socket(zmq.DEALER) for _ in range(8)]
for s in socks:
    s.setsockopt(zmq.LINGER, 0)
    s.connect({endpoint!r})
    s.send_multipart(encode_request("ping", 100, "burst"))  # a client the daemon knows
    assert s.poll(10_000)
    s.recv_multipart()
big = b"\\0" * 7_900_000  # over max_message_bytes (4 MiB), under libzmq's cut (8 MiB)
for i in range({count}):  # from eight connections at once: they arrive faster than read
    for s in socks:
        s.send_multipart([encode_request("ping", i, "burst")[0], big], copy=False)
codes = set()
for s in socks:
    for i in range({count}):
        if not s.poll(10_000):
            break
        r = decode_reply(s.recv_multipart())
        codes.add(r.error.code if r.error else "ok")
print(sorted(codes), flush=True)
"""


@pytest.mark.timeout(240)
def test_memory_after_a_burst_of_large_messages_goes_back(daemon):
    """Large messages are freed once refused, but glibc kept their blocks (62 MB after eighty
    7.9 MB messages from eight connections at once here, 149-164 MB in the issue's runs),
    until the next oversized message: now a trim follows any burst within a second or so."""
    d = daemon()
    code = BURST.format(clients=str(REPO / "clients"), endpoint=d.endpoint, count=10)
    with Camera(d.endpoint):  # its small allocations land between the large blocks
        time.sleep(3.0)
        before = process_stats(d.proc.pid)["rss_kb"]
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             timeout=120).stdout.strip()
        time.sleep(2.5)  # a trim within a second of the burst, and its follow-up
        after = process_stats(d.proc.pid)["rss_kb"]
        status = Path(f"/proc/{d.proc.pid}/status").read_text()
    peak = int(status.split("VmHWM:")[1].split()[0])
    print(f"\n{out}; RSS {before} -> peak {peak} -> {after} kB")
    assert out == "['too-large']", out
    assert peak - before > 32 * 1024, "the burst never reached the daemon's memory"
    assert after - before < 12 * 1024, (before, after)
    assert d.stop() == 0


@pytest.mark.timeout(240)
def test_an_endless_message_cannot_exhaust_memory(daemon):
    """libzmq buffers a message whole before the daemon sees it; a raw ZMTP peer that never
    sends the last frame would grow that buffer until the kernel kills the daemon."""
    d = daemon(max_rss_mb=300)
    script = REPO / "tests" / "server" / "raw_zmtp.py"
    with Camera(d.endpoint) as cam:
        time.sleep(1.5)
        attack = subprocess.Popen([sys.executable, str(script), d.endpoint, "5"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert attack.stdout.readline().strip() == "sending"
            out = attack.communicate(timeout=60)[0].strip()
        finally:
            if attack.poll() is None:
                attack.kill()
                attack.wait()
        time.sleep(1.5)
        alive = d.proc.poll() is None
        status = Path(f"/proc/{d.proc.pid}/status").read_text() if alive else ""
    peak_kb = int(status.split("VmHWM:")[1].split()[0]) if alive else -1
    rss_kb = int(status.split("VmRSS:")[1].split()[0]) if alive else -1
    print(f"\n{out}; daemon RSS peak {peak_kb} kB, now {rss_kb} kB")
    assert alive, "the daemon died:\n" + log_text(d)[-2000:]
    assert out.startswith("closed after"), out  # the daemon cut it off
    assert not cam.failures, cam.failures[:3]
    assert '"event": "memory_pressure"' in log_text(d)
    assert rss_kb < 300 * 1024 and peak_kb < 1024 * 1024
    assert d.stop() == 0


REPEATED_ATTACK = """
import sys, time, zmq
s = zmq.Context.instance().socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 1000)
s.connect({endpoint!r})
for i in range(3):
    s.send_multipart([b"x"] * 5000)
time.sleep(2.0)
"""


@pytest.mark.timeout(240)
def test_every_sender_of_huge_messages_is_banned(daemon):
    """Oversized messages back to back from two processes: each sender is banned, none
    escapes because the other's message was read in the same pass."""
    d = daemon()
    code = REPEATED_ATTACK.format(endpoint=d.endpoint)
    attackers = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    try:
        for a in attackers:
            a.wait(timeout=60)
    finally:
        for a in attackers:
            if a.poll() is None:
                a.kill()
                a.wait()
    time.sleep(1.0)
    banned = {e.get("peer") for e in d.log_events() if e.get("event") == "peer_banned"}
    assert banned == {f"pid:{a.pid}" for a in attackers}, banned
    assert d.stop() == 0


# ------------------------------------------------------------------ 3. invented camera ids
INVENT = """
import sys, numpy as np, zmq
sys.path.insert(0, {clients!r})
from stgcnd_client.wire import decode_reply, encode_request
s = zmq.Context.instance().socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect({endpoint!r})
frame = np.zeros((3, 33, 1), np.float32)
sent = got = busy = 0
total, window = {count}, 64
while got < total:
    while sent < total and sent - got < window:
        s.send_multipart(encode_request("push", sent, f"invented-{{sent}}", arrays=[frame]))
        sent += 1
        if sent == 2000:
            print("flooding", flush=True)
    if s.poll(5000):
        busy += decode_reply(s.recv_multipart()).error is not None
        got += 1
    else:
        break
print(sent, got, busy, flush=True)
"""


@pytest.mark.timeout(300)
def test_invented_camera_ids_cannot_lock_out_a_new_camera(daemon):
    count = 100_000
    d = daemon()
    code = INVENT.format(clients=str(REPO / "clients"), endpoint=d.endpoint, count=count)
    flood = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert flood.stdout.readline().strip() == "flooding"
        time.sleep(1.0)
        frame = np.zeros((3, 33, 1), np.float32)
        with Client(d.endpoint, camera_id="legit", timeout=2.0, retries=0) as c:
            t0 = time.monotonic()
            waited = None
            while time.monotonic() - t0 < 10:
                try:
                    c.push(frame)
                    waited = time.monotonic() - t0
                    break
                except ServerError as exc:
                    assert exc.code == "busy", exc
                    time.sleep(0.04)
            for _ in range(50):  # and it stays served while the flood goes on
                c.push(frame)
                time.sleep(0.01)
            rss = process_stats(d.proc.pid)["rss_kb"]
        out = flood.communicate(timeout=240)[0].split()
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait()
    sent, got, busy = map(int, out)
    print(f"\nlegit camera served after {waited}; flood {sent} sent, {got} answered, "
          f"{busy} refused; RSS {rss} kB")
    assert waited is not None and waited <= 1.0, waited
    assert got == sent == count
    assert rss < 200 * 1024
    assert d.stop() == 0


# ------------------------------------------------------------------ 3b. lockout by many peers
FLOOD = """
import sys, time, numpy as np, zmq
sys.path.insert(0, {clients!r})
from stgcnd_client.wire import decode_reply, encode_request
s = zmq.Context.instance().socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect({endpoint!r})
frame = np.zeros((3, 33, 1), np.float32)
sent = got = busy = 0
end = time.monotonic() + {seconds}
while time.monotonic() < end or got < sent:
    while time.monotonic() < end and sent - got < 64:
        s.send_multipart(encode_request("push", sent, f"{tag}-{{sent % {ids}}}",
                                        arrays=[frame]))
        sent += 1
        if sent == 200:
            print("flooding", flush=True)
    if not s.poll(5000):
        break
    busy += decode_reply(s.recv_multipart()).error is not None
    got += 1
print(sent, got, busy, flush=True)
"""

HOLD = """
import sys, time, numpy as np, zmq
sys.path.insert(0, {clients!r})
from stgcnd_client.wire import decode_reply, encode_request
ctx = zmq.Context.instance()
frame = np.zeros((3, 33, 1), np.float32)
socks, poller = [], zmq.Poller()
for i in range({conns}):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect({endpoint!r})
    socks.append(s)
    poller.register(s, zmq.POLLIN)
index = {{s: i for i, s in enumerate(socks)}}
sent = [0] * len(socks)

def send(i):
    # one camera per connection, kept busy: a frame at a time, its window never completed
    op = "reset" if sent[i] % 20 == 19 else "push"
    socks[i].send_multipart(encode_request(op, sent[i], f"hold-{{i}}",
                                           arrays=[frame] if op == "push" else []))
    sent[i] += 1

for i in range(len(socks)):
    send(i)
got = busy = 0
end = time.monotonic() + {seconds}
announced = False
while time.monotonic() < end:
    for s, _ in poller.poll(1000):
        busy += decode_reply(s.recv_multipart()).error is not None
        got += 1
        send(index[s])
    if not announced and got >= 5 * len(socks):
        print("holding", flush=True)
        announced = True
print(sum(sent), got, busy, flush=True)
"""

# One process, one served camera per connection, each infer-ing a window every 0.2 s
# (issue #41: 70 of them, keyed by their user on the loopback, held every slot).
INFER_HOLD = """
import sys, time, numpy as np, zmq
sys.path.insert(0, {clients!r})
from stgcnd_client.wire import decode_reply, encode_request
ctx = zmq.Context.instance()
window = np.zeros((3, {frames}, 33, 1), np.float32)
socks, poller = [], zmq.Poller()
for i in range({conns}):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect({endpoint!r})
    socks.append(s)
    poller.register(s, zmq.POLLIN)
index = {{s: i for i, s in enumerate(socks)}}
sent = [0] * len(socks)
due = [time.monotonic()] * len(socks)
waiting = set()
got = busy = served = 0
end = time.monotonic() + {seconds}
announced = False
while time.monotonic() < end:
    now = time.monotonic()
    for i in range(len(socks)):
        if i not in waiting and due[i] <= now:
            socks[i].send_multipart(encode_request("infer", sent[i], f"hold-{{i}}",
                                                   arrays=[window]))
            sent[i] += 1
            waiting.add(i)
            due[i] = now + 0.2
    for s, _ in poller.poll(20):
        error = decode_reply(s.recv_multipart()).error
        busy += error is not None
        served += error is None
        got += 1
        waiting.discard(index[s])
    if not announced and served >= 3 * len(socks):
        print("holding", flush=True)
        announced = True
print(sum(sent), got, busy, flush=True)
"""


def camera_listed(endpoint: str, name: str) -> bool:
    with Client(endpoint, camera_id="observer", timeout=5.0, retries=2) as c:
        return name in c.stats()["cameras"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("attack", ["16-processes", "70-loopback-connections",
                                    "70-served-loopback-connections"])
def test_a_served_camera_is_not_locked_out_by_many_peers(daemon, attack):
    """Issue #36: a camera served once comes back, on a new connection, while (a) 16
    processes invent ids, or (b) one process keeps one camera busy on each of 70 loopback tcp
    connections (each used to be a peer of its own: 70 peers, 64 slots); it must be served
    within 1 s. Issue #41: (c) as (b), each camera served (an infer every 0.2 s): keyed by
    their user, those 70 connections and the returning camera were one peer, and it got
    `busy` for as long as they kept sending."""
    tcp = attack != "16-processes"
    d = daemon(endpoint=f"tcp://127.0.0.1:{free_tcp_port()}" if tcp else None)
    window = np.zeros((3, FRAMES, 33, 1), np.float32)
    with Client(d.endpoint, camera_id="legit", timeout=5.0) as c:
        c.infer(window)  # served once
    seconds = 14.0
    clients = str(REPO / "clients")
    if attack == "70-served-loopback-connections":
        codes = [INFER_HOLD.format(clients=clients, endpoint=d.endpoint, conns=70,
                                   seconds=seconds, frames=FRAMES)]
    elif tcp:
        codes = [HOLD.format(clients=clients, endpoint=d.endpoint, conns=70, seconds=seconds)]
    else:
        codes = [FLOOD.format(clients=clients, endpoint=d.endpoint, seconds=seconds,
                              ids=1500, tag=f"p{i}") for i in range(16)]
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for code in codes]
    try:
        for p in procs:
            assert p.stdout.readline().strip() in ("flooding", "holding")
        # The camera stays away until a full table gave its slot away (5 s quiet), or 7 s.
        t0 = time.monotonic()
        while camera_listed(d.endpoint, "legit") and time.monotonic() - t0 < 7.0:
            time.sleep(0.25)
        evicted = not camera_listed(d.endpoint, "legit")
        waited, refused = None, 0
        with Client(d.endpoint, camera_id="legit", timeout=2.0, retries=0) as c:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5.0:
                try:
                    c.infer(window)
                    waited = time.monotonic() - t0
                    break
                except ServerError as exc:
                    assert exc.code == "busy", exc
                    refused += 1
                    time.sleep(0.02)
            stats = c.stats()
        outs = [p.communicate(timeout=60)[0].split() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    sent, got, busy = (sum(int(o[k]) for o in outs) for k in range(3))
    peers = {e.get("peer") for e in d.log_events() if e.get("event") == "camera_evicted"}
    print(f"\n{attack}: legit camera (evicted before coming back: {evicted}) served after "
          f"{waited} s, {refused} busy first; attack {sent} sent, {got} answered, {busy} busy; "
          f"{len(stats['cameras'])} cameras in the table; eviction log peers {sorted(peers)[:4]}")
    assert waited is not None and waited <= 1.0, (waited, refused)
    assert d.stop() == 0


# ------------------------------------------------------------------ 4. SIGTERM race
class Sender(threading.Thread):
    """Keeps 4 requests in flight; a reply saying shutting-down makes it stop sending 20 ms
    later (a camera's next frames are on their way by the time it reads the error); then it
    collects the replies still due. The daemon refuses until 100 ms pass without a request."""

    def __init__(self, endpoint: str, index: int) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.index = endpoint, index
        self.sent: list[int] = []
        self.replies: dict[int, list[str]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.endpoint)
        window = np.zeros((3, FRAMES, 33, 1), np.float32)
        frame = np.zeros((3, 33, 1), np.float32)
        rid, stop_at = 0, None
        try:
            while True:
                stopping = stop_at is not None and time.monotonic() >= stop_at
                while not stopping and len(self.sent) - len(self.replies) < 4:
                    rid += 1
                    op, arrays = (("infer", [window]), ("push", [frame]), ("ping", []))[rid % 3]
                    s.send_multipart(encode_request(op, rid, f"race-{self.index}",
                                                    arrays=arrays))
                    self.sent.append(rid)
                if len(self.replies) == len(self.sent) and stopping:
                    return
                if not s.poll(3000 if stopping else 100):
                    if stopping:
                        return  # the daemon is gone: what is missing was lost
                    continue
                reply = decode_reply(s.recv_multipart())
                code = "ok" if reply.ok else reply.error.code
                self.replies.setdefault(reply.id, []).append(code)
                if code == "shutting-down" and stop_at is None:
                    stop_at = time.monotonic() + 0.02
        finally:
            s.close(0)
            self.done.set()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("delay", [0.3, 1.1])
def test_every_request_before_sigterm_gets_exactly_one_reply(daemon, delay):
    d = daemon()
    senders = [Sender(d.endpoint, i) for i in range(16)]
    for s in senders:
        s.start()
    time.sleep(delay)
    d.signal(signal.SIGTERM)
    code = d.proc.wait(timeout=30)
    for s in senders:
        s.done.wait(10)
    assert code == 0
    lost = {s.index: sorted(set(s.sent) - set(s.replies)) for s in senders}
    twice = {s.index: [i for i, r in s.replies.items() if len(r) > 1] for s in senders}
    codes = {c for s in senders for r in s.replies.values() for c in r}
    assert all(s.sent for s in senders)
    assert not any(lost.values()), f"requests without a reply: {lost}"
    assert not any(twice.values()), f"requests answered twice: {twice}"
    assert codes <= {"ok", "shutting-down"}, codes
    assert "shutting-down" in codes
    events = [json.loads(line) for line in d.log_path.read_text().splitlines()
              if line.startswith("{")]
    assert any(e.get("event") == "shutdown_complete" and e.get("exit_code") == 0
               for e in events)


# ------------------------------------------------------------------ 5. abstract ipc
@pytest.mark.timeout(120)
def test_a_linux_abstract_ipc_endpoint_is_served(daemon):
    """`ipc://@name` has no socket file: passed the start-up check, then failed at the bind
    (chmod of a file that does not exist: "this is a bug")."""
    from stgcnd.errors import UserError
    from stgcnd.server.transport import check_endpoint

    endpoint = f"ipc://@stgcnd-test-{time.monotonic_ns()}"
    d = daemon(endpoint=endpoint)
    with Client(endpoint, camera_id="abstract", timeout=5.0) as c:
        assert c.ping()
        c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
    with pytest.raises(UserError, match="another process is listening"):
        check_endpoint(endpoint)
    assert d.stop() == 0
    check_endpoint(endpoint)  # free again: nothing left behind
