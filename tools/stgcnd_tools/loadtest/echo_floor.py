"""The floor under the daemon's round trip and CPU: bare ZeroMQ, no daemon.

An echo ROUTER answers what a window request is on the wire; the daemon's overhead and CPU per
request cannot go below it on the same machine. `--scenario` measures it at its own load in
the same run (`measure`); scripts/zmq_echo_floor.py runs it alone.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import queue
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from stgcnd.errors import UserError
from stgcnd_tools.stats import distribution

REQUEST = [b"h" * 90, np.zeros((3, 150, 33, 1), np.float32).tobytes()]
REPLY = b"r" * 60
STOP = b"stop"
# The script's closed loop counts the echo's CPU after this many requests (start-up excluded).
WARM_UP = 1000
# Spawned processes import numpy and pyzmq before they answer (seconds on a busy 2-core CPU).
SPAWN_TIMEOUT_S = 60.0
# Between "every camera process is ready" and its first send: time for the go to reach all.
START_DELAY_S = 0.3


def exact_sleeps() -> None:
    """Linux lets a sleeping thread oversleep by its timer slack (50 us by default), which the
    daemon's timerfd does not pay; ask for 1 ns so that a sleeping hold is as exact."""
    try:
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK
    except (OSError, AttributeError):
        pass


def hold(seconds: float, spin: bool) -> None:
    """Answer `seconds` late, as the daemon does while the GPU computes: asleep, or spinning
    (the echo's own thread then stays awake)."""
    if seconds <= 0:
        return
    if not spin:
        time.sleep(seconds)
        return
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def serve(bind: str, bound: Any, hold_s: float = 0.0, spin: bool = False,
          warm_up: int = WARM_UP) -> None:
    """The echo process: bind `bind`, put the endpoint it got on `bound`, answer until a
    stop request, which is answered "CPU_US SERVED" (CPU_US -1: fewer than `warm_up`
    requests came, so the clock would hold start-up too)."""
    exact_sleeps()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(bind)
    bound.put(router.getsockopt_string(zmq.LAST_ENDPOINT))
    served, cpu0, warm = 0, time.process_time(), warm_up == 0
    while True:
        msg = router.recv_multipart(copy=False)
        if len(msg) == 2 and msg[1].bytes == STOP:
            cpu_us = (time.process_time() - cpu0) / served * 1e6 if warm and served else -1.0
            router.send_multipart([msg[0].bytes, f"{cpu_us:.1f} {served}".encode()])
            break
        hold(hold_s, spin)
        router.send_multipart([msg[0].bytes, REPLY])
        served += 1
        if not warm and served == warm_up:
            served, cpu0, warm = 0, time.process_time(), True
    router.close(0)
    ctx.term()


@dataclass(frozen=True)
class EchoCpu:
    us_per_request: float | None  # None: fewer requests than the warm-up
    requests: int                 # counted after the warm-up


class Echo:
    """The echo in a process of its own (spawned: nothing of the caller's state is copied);
    a context manager. `endpoint` is where cameras connect."""

    def __init__(self, transport: str = "ipc", hold_s: float = 0.0, spin: bool = False,
                 warm_up: int = WARM_UP) -> None:
        if transport == "ipc":
            self._tmp: Path | None = Path(tempfile.mkdtemp(prefix="stgcnd-echo-"))
            bind = f"ipc://{self._tmp / 'echo.sock'}"
        elif transport == "tcp":
            self._tmp, bind = None, "tcp://127.0.0.1:*"
        else:
            raise UserError(f"the echo floor runs over ipc or tcp, not {transport!r}")
        ctx = multiprocessing.get_context("spawn")
        bound = ctx.Queue()
        self.proc = ctx.Process(target=serve, args=(bind, bound, hold_s, spin, warm_up),
                                name="zmq-echo", daemon=True)
        self.proc.start()
        try:
            self.endpoint: str = bound.get(timeout=SPAWN_TIMEOUT_S)
        except queue.Empty:
            self.close()
            raise UserError(f"the ZeroMQ echo did not start within {SPAWN_TIMEOUT_S:.0f} s "
                            "(a very busy machine?); run again when it is quieter") from None
        self.cpu: EchoCpu | None = None

    def stop(self) -> EchoCpu:
        """Ask the echo for its CPU per request and let it end."""
        if self.cpu is not None:
            return self.cpu
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(self.endpoint)
        dealer.send_multipart([STOP])
        answered = dealer.poll(int(SPAWN_TIMEOUT_S * 1e3))
        reply = dealer.recv_multipart()[-1].decode().split() if answered else ["-1", "0"]
        dealer.close(0)
        ctx.term()
        cpu_us, served = float(reply[0]), int(reply[1])
        self.cpu = EchoCpu(cpu_us if cpu_us >= 0 else None, served)
        self.close()
        return self.cpu

    def close(self) -> None:
        self.proc.join(5.0)
        if self.proc.is_alive():  # our own child, by its handle
            self.proc.terminate()
            self.proc.join(5.0)
        if self._tmp is not None:
            (self._tmp / "echo.sock").unlink(missing_ok=True)
            self._tmp.rmdir()
            self._tmp = None

    def __enter__(self) -> Echo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def closed_loop(endpoint: str, n: int, rate_hz: float = 0.0) -> list[float]:
    """One camera, N round trips (seconds), back to back, or paced at `rate_hz` as a camera
    is: between round trips every thread on the path sleeps for most of a period."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    times = []
    period = 1.0 / rate_hz if rate_hz > 0 else 0.0
    due = time.perf_counter()
    for _ in range(n):
        if period:
            due += period
        t0 = time.perf_counter()
        dealer.send_multipart(REQUEST)
        dealer.recv_multipart()
        times.append(time.perf_counter() - t0)
        if period:
            time.sleep(max(due - time.perf_counter(), 0.0))
    dealer.close(0)
    ctx.term()
    return times


def open_loop(endpoint: str, cameras: int, rate_hz: float, seconds: float, offset: float,
              start: float, warmup_s: float = 0.0) -> list[float]:
    """K cameras in this thread, each sending `rate_hz` windows a second on a fixed schedule
    from `start` (time.monotonic) for `seconds`, phases spread over one period from `offset`
    (a fraction of it), as `stgcnd loadtest --rate` spreads them. Returns the round trips
    (seconds) of the requests scheduled after `warmup_s`."""
    ctx = zmq.Context()
    socks = []
    for _ in range(cameras):
        s = ctx.socket(zmq.DEALER)
        s.connect(endpoint)
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    index = {s: j for j, s in enumerate(socks)}
    period = 1.0 / rate_hz
    # Requests are numbered, not timed, in or out of the warm-up: a busy machine that sends
    # late must not move a warm-up request into the measured ones.
    total, warm = round(seconds * rate_hz), round(warmup_s * rate_hz)
    count = [0] * cameras
    def due(j: int) -> float:
        return start + (offset + j / cameras + count[j]) * period
    sent: list[list[tuple[int, float]]] = [[] for _ in socks]  # (number, send time) out
    trips: list[float] = []
    give_up = start + seconds + 1.0  # a reply lost after the end: stop waiting for it
    while True:
        waiting = [j for j in range(cameras) if count[j] < total]
        if not waiting and not any(sent):
            break
        now = time.monotonic()
        if not waiting and now > give_up:
            break
        wait = min(due(j) for j in waiting) - now if waiting else give_up - now
        for sock, _ in poller.poll(int(max(wait, 0.0) * 1e3)):
            while sock.get(zmq.EVENTS) & zmq.POLLIN:
                sock.recv_multipart(zmq.NOBLOCK)
                back = time.monotonic()
                number, t0 = sent[index[sock]].pop(0)
                if number >= warm:
                    trips.append(back - t0)
        for j in waiting:
            if time.monotonic() >= due(j):
                sent[j].append((count[j], time.monotonic()))
                socks[j].send_multipart(REQUEST)
                count[j] += 1
    for s in socks:
        s.close(0)
    ctx.term()
    return trips


def _camera_process(endpoint: str, cameras: int, rate_hz: float, seconds: float,
                    offset: float, warmup_s: float, results: Any, go: Any,
                    start_wall: Any) -> None:
    results.put(("ready", offset))
    go.wait()
    start = time.monotonic() + (start_wall.value - time.time())
    results.put(("done", offset, open_loop(endpoint, cameras, rate_hz, seconds, offset, start,
                                   warmup_s)))


@dataclass(frozen=True)
class Floor:
    """The bare ZeroMQ floor at one load."""

    transport: str
    processes: int
    cameras: int              # per process
    rate_hz: float
    seconds: float
    warmup_s: float
    round_trip_ms: dict[str, Any]       # stats.distribution of the measured round trips
    echo_cpu_us_per_request: float | None
    echo_requests: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure(processes: int, cameras: int, rate_hz: float, seconds: float,
            transport: str = "ipc", warmup_s: float = 1.0) -> Floor:
    """P processes x K cameras at `rate_hz` against an echo for `seconds`: the round trips
    after `warmup_s`, and the echo's CPU per request after as many requests as that warm-up
    sends."""
    if not (processes >= 1 and cameras >= 1 and rate_hz > 0 and seconds > warmup_s >= 0):
        raise UserError(f"the floor needs processes and cameras >= 1, a rate > 0 and more "
                        f"seconds than its warm-up; got {processes} x {cameras} at "
                        f"{rate_hz:g} Hz for {seconds:g} s (warm-up {warmup_s:g} s)")
    warm_up = processes * cameras * round(rate_hz * warmup_s)  # as open_loop numbers them
    with Echo(transport, warm_up=warm_up) as echo:
        ctx = multiprocessing.get_context("spawn")
        results, go, start_wall = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
        procs = [ctx.Process(target=_camera_process, name=f"zmq-echo-cameras-{i}", daemon=True,
                             args=(echo.endpoint, cameras, rate_hz, seconds, i / processes,
                                   warmup_s, results, go, start_wall))
                 for i in range(processes)]
        for p in procs:
            p.start()
        try:
            collect(results, procs, "ready", SPAWN_TIMEOUT_S)
            start_wall.value = time.time() + START_DELAY_S
            go.set()
            trips = [t for msg in collect(results, procs, "done", seconds + 30.0)
                     for t in msg[2]]
        finally:
            go.set()
            join(procs)
        cpu = echo.stop()
    return Floor(transport=transport, processes=processes, cameras=cameras, rate_hz=rate_hz,
                 seconds=seconds, warmup_s=warmup_s,
                 round_trip_ms=distribution(np.asarray(trips) * 1e3),
                 echo_cpu_us_per_request=cpu.us_per_request, echo_requests=cpu.requests)


def collect(results: Any, procs: list[Any], kind: str, timeout: float) -> list[tuple]:
    """One `kind` message (kind, process, ...) from every process we spawned; a "failed"
    message or a dead process is an error."""
    got: list[tuple] = []
    end = time.monotonic() + timeout
    while len(got) < len(procs):
        try:
            msg = results.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise UserError(f"process {dead[0].name} died (exit code {dead[0].exitcode})"
                                ) from None
            if time.monotonic() > end:
                raise UserError(f"processes {procs[0].name}... not {kind} within {timeout:.0f} "
                                "s (a very busy machine?)") from None
            continue
        if msg[0] == "failed":
            # A traceback's last line says what failed; a plain message is one line anyway.
            raise UserError(f"process {msg[1]} failed: {msg[2].strip().splitlines()[-1]}")
        if msg[0] == kind:
            got.append(msg)
    return got


def join(procs: list[Any]) -> None:
    for p in procs:
        p.join(10.0)
        if p.is_alive():  # only our own children, by their handles
            p.terminate()
            p.join(5.0)
