#!/usr/bin/env python3
"""Measure what a message of millions of frames costs the other cameras when its connection
first sent a valid request (issue #41, item 2; docs/hardening.md, "What a huge message still
costs").

    python scripts/frames_after_request.py --trials 5 --frames 5000000
    python scripts/frames_after_request.py --src /path/to/older/checkout   # the code before

Each trial starts a fresh daemon (`python -m stgcnd serve` from --src, default this checkout;
the noop model with 1 ms of simulated compute, on ipc), lets --cameras cameras infer a window
every 40 ms on their own connections, then one raw ZMTP connection sends a ping, reads its
reply, and sends one message of --frames empty frames. Per trial it reports the attacker's
outcome, the cameras' longest wait for a reply from the attack on, how many of their
requests were never answered (within 10 s: no retries), the daemon's peak RSS (VmHWM) and
its RSS before and 3 s after. Exits 1 if the daemon died or a camera request was lost.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "server"))
sys.path.insert(0, str(REPO / "clients"))

from raw_zmtp import connect, frame, read_message  # noqa: E402

from stgcnd_client.wire import decode_reply, encode_request  # noqa: E402

FRAMES = 30
LOST_AFTER_S = 10.0   # a camera's request unanswered this long is lost
PERIOD_S = 0.04       # each camera sends a window every 40 ms
CONFIG = """[server]
endpoint = "{endpoint}"
engines_dir = "{engines}"
stats_interval = 1.0
warmup_runs = 1
[[models]]
name = "demo"
backend = "noop"
demo = true
frames = {frames}
noop_compute_us = 1000
"""


class Camera(threading.Thread):
    """A raw DEALER inferring a window every PERIOD_S, one request outstanding, no retries:
    every reply time kept, every request unanswered within LOST_AFTER_S counted lost."""

    def __init__(self, endpoint: str, name: str) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.name = endpoint, name
        self.stop = threading.Event()
        self.replies: list[float] = []
        self.lost = 0

    def run(self) -> None:
        window = np.random.default_rng(0).random((3, FRAMES, 33, 1), dtype=np.float32)
        s: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.endpoint)
        req_id, next_at = 0, time.monotonic()
        try:
            while not self.stop.is_set():
                req_id += 1
                s.send_multipart(encode_request("infer", req_id, self.name, arrays=[window]))
                end = time.monotonic() + LOST_AFTER_S
                while True:
                    left = end - time.monotonic()
                    if left <= 0 or not s.poll(int(left * 1e3)):
                        self.lost += 1
                        break
                    if decode_reply(s.recv_multipart()).id == req_id:  # a late one: skip
                        self.replies.append(time.monotonic())
                        break
                next_at = max(next_at + PERIOD_S, time.monotonic())
                time.sleep(max(next_at - time.monotonic(), 0))
        finally:
            s.close(0)

    def longest_wait(self, start: float, end: float) -> float:
        marks = [start, *(t for t in self.replies if start <= t <= end), end]
        return max(b - a for a, b in zip(marks, marks[1:]))


def attack(endpoint: str, frames: int) -> None:
    """In a process of its own (the daemon bans the sender's process): a ping, its reply
    read, then one message of `frames` empty frames on the same connection, built as ZMTP
    bytes so that it arrives as fast as libzmq can take it. Prints "pong", then the end."""
    sock = connect(endpoint)
    sock.sendall(frame(encode_request("ping", 7, "attacker")[0], more=False))
    sock.settimeout(10)
    wire = frame(b"", more=True) * (frames - 1) + frame(b"", more=False)
    print("pong" if decode_reply(read_message(sock)).ok else "refused", flush=True)
    try:
        sock.sendall(wire)
        sock.settimeout(30)
        code = decode_reply(read_message(sock)).error.code  # taken whole
        while sock.recv(65536):
            pass
        print(f"answered {code}, then closed", flush=True)
    except (OSError, ConnectionError) as exc:
        print(f"cut ({type(exc).__name__})", flush=True)
    finally:
        sock.close()


def vm_kb(pid: int, key: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split(f"{key}:")[1].split()[0])


def ping(endpoint: str, timeout_s: float) -> bool:
    s: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send_multipart(encode_request("ping", 1, "probe"))
        return bool(s.poll(int(timeout_s * 1e3)))
    finally:
        s.close(0)


def trial(src: Path, frames: int, cameras: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="stgcnd-frames-") as tmp:
        endpoint = f"ipc://{tmp}/d.sock"
        config = Path(tmp) / "stgcnd.toml"
        config.write_text(CONFIG.format(endpoint=endpoint, engines=f"{tmp}/engines",
                                        frames=FRAMES))
        env = {**os.environ, "PYTHONPATH": f"{src / 'daemon'}:{src / 'clients'}"}
        with open(Path(tmp) / "daemon.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "stgcnd", "--log-format", "json",
                                     "serve", "--config", str(config)], stdout=log,
                                    stderr=subprocess.STDOUT, env=env, cwd=tmp)
        try:
            end = time.monotonic() + 120
            while not ping(endpoint, 1.0):
                if proc.poll() is not None or time.monotonic() > end:
                    raise SystemExit("the daemon did not start: "
                                     + (Path(tmp) / "daemon.log").read_text()[-2000:])
            cams = [Camera(endpoint, f"cam-{i}") for i in range(cameras)]
            for c in cams:
                c.start()
            time.sleep(3.0)  # two stats ticks: the RSS settled
            before = vm_kb(proc.pid, "VmRSS")
            attacker = subprocess.Popen([sys.executable, __file__, "--attack", endpoint,
                                         str(frames)], stdout=subprocess.PIPE, text=True)
            assert attacker.stdout is not None
            pong = attacker.stdout.readline().strip()
            start = time.monotonic()
            outcome = attacker.communicate(timeout=120)[0].strip()
            time.sleep(3.0)  # the trims after a cut
            t_end = time.monotonic()
            for c in cams:
                c.stop.set()
            for c in cams:
                c.join(LOST_AFTER_S + 5)
            alive = proc.poll() is None
            result = {
                "outcome": outcome, "ping": pong == "pong", "alive": alive,
                "wait_s": max(c.longest_wait(start, t_end) for c in cams),
                "lost": sum(c.lost for c in cams),
                "answered": sum(len(c.replies) for c in cams),
                "peak_mb": vm_kb(proc.pid, "VmHWM") / 1024 if alive else -1,
                "before_mb": before / 1024,
                "after_mb": vm_kb(proc.pid, "VmRSS") / 1024 if alive else -1,
            }
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--frames", type=int, default=5_000_000)
    parser.add_argument("--cameras", type=int, default=4)
    parser.add_argument("--src", type=Path, default=REPO,
                        help="the checkout whose daemon runs (default: this one)")
    parser.add_argument("--attack", nargs=2, metavar=("ENDPOINT", "FRAMES"),
                        help=argparse.SUPPRESS)  # the attacker's own process
    args = parser.parse_args(argv)
    if args.attack:
        attack(args.attack[0], int(args.attack[1]))
        return 0
    print(f"{args.src}: ping, then {args.frames:,} frames on the same connection; "
          f"{args.cameras} cameras at 25 windows/s; {socket.gethostname()}, "
          f"{os.cpu_count()} CPUs", flush=True)
    bad = False
    for i in range(args.trials):
        r = trial(args.src.resolve(), args.frames, args.cameras)
        print(f"trial {i + 1}: attacker {r['outcome']} (ping answered: {r['ping']}); cameras' "
              f"longest wait {r['wait_s']:.2f} s, {r['lost']} lost of "
              f"{r['answered'] + r['lost']}; daemon peak {r['peak_mb']:.0f} MB, RSS "
              f"{r['before_mb']:.0f} -> {r['after_mb']:.0f} MB, alive: {r['alive']}",
              flush=True)
        bad = bad or not r["alive"] or bool(r["lost"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
