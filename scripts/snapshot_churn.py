#!/usr/bin/env python3
"""What subscription churn on the events socket costs a legitimate subscriber (issue #41,
item 5): a noop daemon with N events open, attackers started, then a subscriber to "" that
counts what it receives for 8 s (snapshots, heartbeats) and the daemon's CPU meanwhile.

    python scripts/snapshot_churn.py                       # every scenario, ipc
    python scripts/snapshot_churn.py --transport tcp --scenarios quiet oneshot

Scenarios (each on a fresh daemon): `quiet` (no attacker); `toggle` (one SUB toggling its
subscription to "" every --toggle-ms); `oneshot` (two processes subscribing and
unsubscribing a new topic each time, as fast as they can; a SUB reconnects by itself when
cut); `reconnect` (one process opening a new SUB connection to "" for each subscription).
`rotate` (an attacker kind only, for tests): one-shot topics, a new connection every 1,000.
Prints one line per scenario and the ratio to the quiet one. On tcp the loopback peer is the
user (docs/hardening.md, "Camera slots"): run as root, the attackers drop to --attacker-uid
(default nobody) so that the subscriber is another peer, as a camera site's would be.

Needs pyzmq, msgspec and the stgcnd packages (PYTHONPATH=daemon:clients:tools).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np
import zmq

from stgcnd_client import Client
from stgcnd_tools.daemon import DaemonProcess

MODEL = """[[models]]
name = "demo"
backend = "noop"
demo = true
frames = 30
labels = ["normal", "shoplifting"]
[models.events]
enter = 0.5
exit = 0.4
min_duration_s = 0.0
min_usable = 0.0
event_idle_s = 600.0
"""
WINDOW = np.zeros((3, 30, 33, 1), np.float32)


def attacker(kind: str, endpoint: str, toggle_ms: float, uid: int | None) -> None:
    """One attacking process (run as `--attacker KIND ENDPOINT`); stops when killed."""
    if uid is not None:
        os.setgid(uid)
        os.setuid(uid)
    ctx = zmq.Context()
    if kind == "reconnect":
        while True:
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.connect(endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            time.sleep(0.01)  # long enough for the subscription to leave
            sub.close(0)
    if kind == "rotate":
        for n in itertools.count():
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SNDHWM, 0)
            sub.connect(endpoint)
            for i in range(1000):
                sub.setsockopt(zmq.SUBSCRIBE, f"rotate-{n}-{i}".encode())
                sub.setsockopt(zmq.UNSUBSCRIBE, f"rotate-{n}-{i}".encode())
            time.sleep(0.05)  # long enough for them to leave
            sub.close(0)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SNDHWM, 0)
    sub.setsockopt(zmq.RCVHWM, 1)  # it reads nothing: what it is sent is dropped
    sub.connect(endpoint)
    i = 0
    while True:
        if kind == "toggle":
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            time.sleep(toggle_ms / 2e3)
            sub.setsockopt(zmq.UNSUBSCRIBE, b"")
            time.sleep(toggle_ms / 2e3)
        else:  # oneshot
            topic = f"oneshot-{os.getpid()}-{i}".encode()
            sub.setsockopt(zmq.SUBSCRIBE, topic)
            sub.setsockopt(zmq.UNSUBSCRIBE, topic)
            i += 1


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scenario(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    run = tmp / name
    run.mkdir()
    endpoint = f"ipc://{run / 'd.sock'}"
    if args.transport == "ipc":
        events = f"ipc://{run / 'events.sock'}"
    else:
        with __import__("socket").socket() as s:
            s.bind(("127.0.0.1", 0))
            events = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    config = run / "stgcnd.toml"
    config.write_text(f'[server]\nendpoint = "{endpoint}"\nengines_dir = "{run / "engines"}"\n'
                      f'events_endpoint = "{events}"\nwarmup_runs = 1\n' + MODEL)
    daemon = DaemonProcess(config, run / "daemon.log", endpoint=endpoint).start()
    attackers: list[subprocess.Popen[bytes]] = []
    try:
        daemon.wait_ready(120)
        for i in range(args.open):
            with Client(endpoint, camera_id=f"cam{i:02d}") as cam:
                cam.infer(WINDOW)
        kinds = {"quiet": [], "toggle": ["toggle"], "oneshot": ["oneshot", "oneshot"],
                 "reconnect": ["reconnect"]}[name]
        drop = (["--attacker-uid", str(args.attacker_uid)]
                if args.transport == "tcp" and os.getuid() == 0 else [])
        for kind in kinds:
            attackers.append(subprocess.Popen([
                sys.executable, __file__, "--attacker", kind, events,
                "--toggle-ms", str(args.toggle_ms), *drop]))
        time.sleep(args.warmup)
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(events)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        counts: dict[str, int] = {}
        first_snapshot_s = first_message_s = None
        assert daemon.pid is not None
        cpu0, t0 = cpu_s(daemon.pid), time.monotonic()
        end = t0 + args.seconds
        while time.monotonic() < end:
            if sub.poll(max(int((end - time.monotonic()) * 1e3), 1)):
                kind = str(msgspec.msgpack.decode(sub.recv_multipart()[1])["kind"])
                counts[kind] = counts.get(kind, 0) + 1
                first_message_s = first_message_s or round(time.monotonic() - t0, 3)
                if kind == "snapshot" and first_snapshot_s is None:
                    first_snapshot_s = round(time.monotonic() - t0, 3)
        cpu = (cpu_s(daemon.pid) - cpu0) / (time.monotonic() - t0)
        with Client(endpoint, camera_id="probe") as probe:
            feed = probe.stats().get("events_connections", {})
        sub.close(0)
        ctx.term()
    finally:
        for proc in attackers:
            proc.kill()
            proc.wait()
        daemon.stop()
    lines = [json.loads(line) for line in (run / "daemon.log").read_text().splitlines()
             if line.startswith("{")]
    bans = sum(e.get("event") == "peer_banned" for e in lines)
    return {"scenario": name, "snapshots": counts.get("snapshot", 0),
            "heartbeats": counts.get("heartbeat", 0), "messages": sum(counts.values()),
            "first_message_s": first_message_s, "first_snapshot_s": first_snapshot_s,
            "daemon_cpu_pct": round(100 * cpu, 1), "peer_banned_lines": bans,
            "events_connections": feed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", nargs="+", default=["quiet", "toggle", "oneshot",
                                                            "reconnect"])
    parser.add_argument("--transport", choices=("ipc", "tcp"), default="ipc")
    parser.add_argument("--open", type=int, default=32, help="events open (one per camera)")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds the attackers run before the subscriber comes")
    parser.add_argument("--toggle-ms", type=float, default=10.0)
    parser.add_argument("--attacker-uid", type=int, default=65534)
    parser.add_argument("--attacker", nargs=2, metavar=("KIND", "ENDPOINT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attacker:
        uid = args.attacker_uid if "--attacker-uid" in sys.argv else None
        attacker(args.attacker[0], args.attacker[1], args.toggle_ms, uid)
        return
    with tempfile.TemporaryDirectory(prefix="snapshot-churn-") as tmp:
        results = [scenario(name, args, Path(tmp)) for name in args.scenarios]
    quiet = next((r for r in results if r["scenario"] == "quiet"), None)
    for r in results:
        ratio = ""
        if quiet is not None and quiet["messages"]:
            ratio = f"  x{int(r['messages']) / int(quiet['messages']):.1f} of quiet's messages"
        print(json.dumps(r) + ratio, flush=True)


if __name__ == "__main__":
    main()
