"""Measure how long a camera waits for a slot while another peer holds or churns them
(docs/hardening.md, "Camera slots"), on a real daemon (noop model, 1 ms of compute):

  served-peer    one process keeps a served camera infer-ing every 0.2 s on each of 70
                 loopback tcp connections (64 slots); a camera of another process, served
                 before and evicted while away, comes back: seconds until it is served.
  invented-ids   one process sends pushes naming 20,000 invented camera ids (64 in flight);
                 then a new camera of that process and one of another process ask at once,
                 while it goes on inventing for --more seconds (0: once it stopped):
                 seconds until each is served.

Usage: python scripts/camera_slots.py [served-peer|invented-ids] [--trials 3] [--more 5]
(PYTHONPATH: the repository's daemon, clients and tools)."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from stgcnd_client import Client, ServerError
from stgcnd_tools.daemon import DaemonProcess

REPO = Path(__file__).resolve().parents[1]
FRAMES = 30
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

COMMON = """
import sys, time, numpy as np, zmq
sys.path.insert(0, {clients!r})
from stgcnd_client import Client, ServerError
from stgcnd_client.wire import decode_reply, encode_request
ctx = zmq.Context.instance()

def wait_served(name, window):
    with Client({endpoint!r}, camera_id=name, timeout=2.0, retries=0) as c:
        t0 = time.monotonic()
        while True:
            try:
                c.infer(window)
                return time.monotonic() - t0
            except ServerError as exc:
                assert exc.code == "busy", exc
                time.sleep(0.02)
"""

# One served camera per connection, each infer-ing a window every 0.2 s.
HOLD = COMMON + """
window = np.zeros((3, {frames}, 33, 1), np.float32)
socks = []
poller = zmq.Poller()
for i in range(70):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect({endpoint!r})
    socks.append(s)
    poller.register(s, zmq.POLLIN)
index = {{s: i for i, s in enumerate(socks)}}
due, waiting, served, rid, told = [0.0] * 70, set(), 0, 0, False
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    now = time.monotonic()
    for i in range(70):
        if i not in waiting and due[i] <= now:
            rid += 1
            socks[i].send_multipart(encode_request("infer", rid, f"hold-{{i}}",
                                                   arrays=[window]))
            waiting.add(i)
            due[i] = now + 0.2
    for s, _ in poller.poll(20):
        served += decode_reply(s.recv_multipart()).error is None
        waiting.discard(index[s])
    if served >= 210 and not told:
        print("holding", flush=True)
        told = True
"""

# Pushes naming `ids` invented cameras, 64 in flight; then a camera of its own asks, from a
# thread, while the pushes go on naming new ids for `more` seconds (0: they stop).
INVENT = COMMON + """
import threading
frame = np.zeros((3, 33, 1), np.float32)
s = ctx.socket(zmq.DEALER)
s.setsockopt(zmq.LINGER, 0)
s.connect({endpoint!r})
own = []
asker = threading.Thread(target=lambda: own.append(
    wait_served("own-new", np.zeros((3, {frames}, 33, 1), np.float32))))
sent = got = 0
end = None
while end is None or time.monotonic() < end or got < sent:
    while (end is None and sent < {ids} or end is not None and time.monotonic() < end) \
            and sent - got < 64:
        s.send_multipart(encode_request("push", sent, f"invented-{{sent}}", arrays=[frame]))
        sent += 1
    if end is None and sent >= {ids}:
        if {more} == 0:
            while got < sent and s.poll(5000):
                s.recv_multipart()
                got += 1
        print("flooded", flush=True)
        asker.start()
        end = time.monotonic() + {more}
    if not s.poll(5000):
        break
    s.recv_multipart()
    got += 1
asker.join()
print(round(own[0], 3), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listed(endpoint: str, name: str) -> bool:
    with Client(endpoint, camera_id="observer", timeout=5.0, retries=2) as c:
        return name in c.stats()["cameras"]


def served_after(endpoint: str, name: str, window: np.ndarray) -> float:
    with Client(endpoint, camera_id=name, timeout=2.0, retries=0) as c:
        t0 = time.monotonic()
        while True:
            try:
                c.infer(window)
                return time.monotonic() - t0
            except ServerError as exc:
                assert exc.code == "busy", exc
                time.sleep(0.02)


def served_peer(endpoint: str) -> str:
    window = np.zeros((3, FRAMES, 33, 1), np.float32)
    served_after(endpoint, "legit", window)  # served once
    code = HOLD.format(clients=str(REPO / "clients"), endpoint=endpoint, frames=FRAMES,
                       seconds=20)
    hold = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert hold.stdout is not None and hold.stdout.readline().strip() == "holding"
        t0 = time.monotonic()
        while listed(endpoint, "legit") and time.monotonic() - t0 < 8.0:
            time.sleep(0.25)
        away = not listed(endpoint, "legit")
        waited = served_after(endpoint, "legit", window)
        return f"returning camera served after {waited:.3f} s (evicted while away: {away})"
    finally:
        hold.kill()
        hold.wait()


def invented_ids(endpoint: str, more: float, ids: int = 20_000) -> str:
    code = INVENT.format(clients=str(REPO / "clients"), endpoint=endpoint, frames=FRAMES,
                         ids=ids, more=more)
    flood = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "flooded"
        other = served_after(endpoint, "other-new", np.zeros((3, FRAMES, 33, 1), np.float32))
        own = float(flood.stdout.readline())
        going = f"while it sends more for {more:g} s" if more else "once it stopped"
        return (f"after {ids} invented ids, {going}: a new camera of that process served after "
                f"{own:.3f} s, one of another process after {other:.3f} s")
    finally:
        flood.kill()
        flood.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=("served-peer", "invented-ids"))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--more", type=float, default=5.0,
                        help="invented-ids: seconds the invented ids go on after 20,000 "
                             "(0: they stop before the new cameras ask)")
    args = parser.parse_args()
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory() as tmp:
            endpoint = f"tcp://127.0.0.1:{free_port()}" if args.scenario == "served-peer" \
                else f"ipc://{tmp}/stgcnd.sock"
            config = Path(tmp, "stgcnd.toml")
            config.write_text(CONFIG.format(endpoint=endpoint, engines=Path(tmp, "engines"),
                                            frames=FRAMES))
            with DaemonProcess(config, Path(tmp, "log"), endpoint=endpoint) as daemon:
                daemon.wait_ready(120)
                said = served_peer(endpoint) if args.scenario == "served-peer" \
                    else invented_ids(endpoint, args.more)
                print(f"trial {trial + 1}: {said}", flush=True)


if __name__ == "__main__":
    main()
