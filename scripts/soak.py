#!/usr/bin/env python3
"""Soak a stgcnd daemon: many cameras connecting, pushing and sending windows, SIGHUP reloads
under load, some malformed requests; then say whether any reply was lost or duplicated and
whether the daemon's RSS, open fds or threads grew after warm-up (issue #12), and each
camera's worst gap (its slowest reply).

    python scripts/soak.py --minutes 10 --cameras 32 --reload-every 30
    python scripts/soak.py --minutes 5 --endpoint ipc:///run/stgcnd/stgcnd.sock --pid 1234

Without --endpoint it starts its own daemon (`python -m stgcnd serve`, demo model, torch on the
CPU, short windows) and stops it at the end. Exits 1 if a reply was lost, duplicated or did not
match its request, the daemon answered `internal`, died, stalled, did not exit 0 on SIGTERM, or
grew beyond the tolerances after warm-up; 2 on bad arguments.

Client side: pyzmq, msgspec, numpy and stgcnd_client only (each camera is a raw DEALER so that
every request id and every reply can be accounted for).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import zmq

from stgcnd_client.protocol import ProtocolError
from stgcnd_client.wire import decode_reply, encode_request

REPLY_TIMEOUT_S = 10.0     # a reply later than this counts as lost
STALL_S = 5.0              # a ping unanswered this long means the daemon stalled
PING_EVERY_S = 1.0


class Tally:
    """Every request and reply, across camera threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.codes: Counter = Counter()
        self.examples: dict[str, list[str]] = {}

    def add(self, key: str, n: int = 1, example: str | None = None) -> None:
        with self.lock:
            self.counts[key] += n
            if example is not None and len(self.examples.setdefault(key, [])) < 5:
                self.examples[key].append(example)

    def code(self, code: str) -> None:
        with self.lock:
            self.codes[code] += 1


class Camera(threading.Thread):
    """One camera: sessions of a few seconds on a fresh DEALER each, pushing frames at `fps`
    and sometimes sending a whole window; one request outstanding at a time."""

    def __init__(self, index: int, endpoint: str, window: tuple, fps: float,
                 malformed: float, tally: Tally, stop: threading.Event, seed: int) -> None:
        super().__init__(name=f"cam-{index}", daemon=True)
        self.camera = f"soak-{index}"
        self.endpoint = endpoint
        self.window = window
        self.fps = fps
        self.malformed = malformed
        self.tally = tally
        self.stop_event = stop
        self.rng = random.Random(seed + index)
        self.np = np.random.default_rng(seed + index)
        self.next_id = 0
        self.answered: set = set()
        self.worst_s = 0.0  # the camera's slowest answered request: its worst gap

    def run(self) -> None:
        ctx = zmq.Context.instance()
        while not self.stop_event.is_set():
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.endpoint)
            try:
                session_end = time.monotonic() + self.rng.uniform(1.0, 8.0)
                while time.monotonic() < session_end and not self.stop_event.is_set():
                    t0 = time.monotonic()
                    if not self.one_request(sock):
                        break  # lost: a fresh socket, as a real client would
                    time.sleep(max(0.0, 1.0 / self.fps - (time.monotonic() - t0)))
            finally:
                sock.close(0)
            self.tally.add("reconnects")

    def request(self) -> tuple:
        """(frames, id the reply must carry, kind)."""
        self.next_id += 1
        rid = self.next_id
        c, t, v, m = self.window
        if self.rng.random() < self.malformed:
            kind = self.rng.choice(("garbage", "bad-shape", "non-finite", "unknown-op",
                                    "unknown-model"))
            if kind == "garbage":
                return [b"\xc1" + bytes(self.rng.randrange(8))], None, kind
            if kind == "bad-shape":
                return encode_request("push", rid, self.camera,
                                      arrays=[np.zeros((c, v + 1, m), np.float32)]), rid, kind
            if kind == "non-finite":
                frame = np.zeros((c, v, m), np.float32)
                frame[0, 0, 0] = np.nan
                return encode_request("push", rid, self.camera, arrays=[frame]), rid, kind
            if kind == "unknown-op":
                return [msgspec.msgpack.encode({"v": 1, "op": "explode", "id": rid,
                                       "camera": self.camera})], rid, kind
            return encode_request("reset", rid, self.camera, model="no-such-model"), rid, kind
        roll = self.rng.random()
        if roll < 0.05:
            window = self.np.random((c, t, v, m), dtype=np.float32)
            return encode_request("infer", rid, self.camera, arrays=[window],
                                  timeout_ms=REPLY_TIMEOUT_S * 1000), rid, "infer"
        if roll < 0.07:
            return encode_request(self.rng.choice(("ping", "hello", "stats", "reset")), rid,
                                  self.camera), rid, "control"
        frame = self.np.random((c, v, m), dtype=np.float32)
        return encode_request("push", rid, self.camera, arrays=[frame],
                              timeout_ms=REPLY_TIMEOUT_S * 1000), rid, "push"

    def one_request(self, sock: zmq.Socket) -> bool:
        frames, rid, kind = self.request()
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            if not sock.poll(int(REPLY_TIMEOUT_S * 1000), zmq.POLLOUT):
                self.tally.add("lost", example=f"{self.camera} {kind} id {rid}: cannot send")
                return False
            sock.send_multipart(frames)
        self.tally.add("sent")
        sent_at = time.monotonic()
        deadline = sent_at + REPLY_TIMEOUT_S
        while True:
            ms = int((deadline - time.monotonic()) * 1000)
            if ms <= 0 or not sock.poll(ms, zmq.POLLIN):
                self.tally.add("lost", example=f"{self.camera} {kind} id {rid}")
                return False
            try:
                reply = decode_reply(sock.recv_multipart())
            except ProtocolError as exc:
                self.tally.add("mismatched", example=f"{self.camera}: undecodable reply {exc}")
                continue
            if reply.id is not None and reply.id in self.answered:
                self.tally.add("duplicated", example=f"{self.camera} id {reply.id}")
                continue
            if reply.id != rid:
                self.tally.add("mismatched", example=f"{self.camera}: reply id {reply.id}, "
                                                     f"waiting for {rid} ({kind})")
                continue
            if rid is not None:
                self.answered.add(rid)
            self.worst_s = max(self.worst_s, time.monotonic() - sent_at)
            self.tally.add("replies")
            self.tally.code("ok" if reply.ok else reply.error.code)
            if reply.ok and "logits" in reply.result:
                self.tally.add("predictions")
            return True


def proc_stats(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_kb": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def alive(pid: int, proc: subprocess.Popen | None) -> bool:
    if proc is not None:
        return proc.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ping(ctx: zmq.Context, endpoint: str, rid: int, timeout_s: float) -> bool:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(encode_request("ping", rid, "soak-monitor"))
        end = time.monotonic() + timeout_s
        while True:
            ms = int((end - time.monotonic()) * 1000)
            if ms <= 0 or not sock.poll(ms):
                return False
            try:
                if decode_reply(sock.recv_multipart()).id == rid:
                    return True
            except ProtocolError:
                pass
    finally:
        sock.close(0)


class OwnDaemon:
    """`python -m stgcnd serve` on the demo model in a temp dir; the labels flip on each reload
    so that a SIGHUP really loads a new model."""

    def __init__(self, frames: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="stgcnd-soak-"))
        self.endpoint = f"ipc://{self.dir / 'd.sock'}"
        self.frames = frames
        self.config = self.dir / "stgcnd.toml"
        self.log_path = self.dir / "daemon.log"
        self.flip = False
        self.write_config()
        self.proc: subprocess.Popen | None = None

    def write_config(self) -> None:
        labels = '["calm", "theft"]' if self.flip else '["normal", "shoplifting"]'
        self.config.write_text(
            f'[server]\nendpoint = "{self.endpoint}"\nengines_dir = "{self.dir / "engines"}"\n'
            "stats_interval = 5.0\nidle_timeout = 30.0\nwarmup_runs = 1\n"
            f'[[models]]\nname = "demo"\nframes = {self.frames}\nbackend = "torch"\n'
            f'device = "cpu"\nthreads = 1\ndemo = true\nlabels = {labels}\n')

    def start(self, timeout_s: float = 180.0) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the daemon's stdout for its life
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stgcnd", "--log-format", "json", "serve", "--config",
             str(self.config)], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        ctx = zmq.Context.instance()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"soak: the daemon exited with {self.proc.returncode} at "
                                 f"start; its log: {self.log_path}")
            if ping(ctx, self.endpoint, 1, 1.0):
                return
        self.stop()
        raise SystemExit(f"soak: the daemon was not serving after {timeout_s:.0f} s; "
                         f"its log: {self.log_path}")

    def reload(self) -> None:
        assert self.proc is not None
        self.flip = not self.flip
        self.write_config()
        self.proc.send_signal(signal.SIGHUP)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
                return None  # did not stop on SIGTERM
        return self.proc.returncode


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, required=True, help="how long to soak")
    p.add_argument("--cameras", type=int, default=32, help="camera threads (default 32)")
    p.add_argument("--fps", type=float, default=10.0,
                   help="requests per second per camera (default 10)")
    p.add_argument("--reload-every", type=float, default=30.0, metavar="S",
                   help="SIGHUP the daemon every S seconds (0: never; needs our own daemon "
                        "or --pid)")
    p.add_argument("--endpoint", help="soak this running daemon instead of starting one")
    p.add_argument("--pid", type=int, help="the --endpoint daemon's pid, for RSS/fds/threads "
                                           "and reloads")
    p.add_argument("--frames", type=int, default=30,
                   help="window length of our own daemon's demo model (default 30)")
    p.add_argument("--warmup", type=float, default=None, metavar="S",
                   help="seconds before the baseline sample (default: 20%% of the run, <= 60)")
    p.add_argument("--malformed", type=float, default=0.03,
                   help="fraction of malformed requests (default 0.03)")
    p.add_argument("--rss-tolerance-mb", type=float, default=64.0)
    p.add_argument("--fd-tolerance", type=int, default=16)
    p.add_argument("--thread-tolerance", type=int, default=4)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", metavar="PATH", help="also write the report as JSON ('-': stdout)")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.cameras < 1 or args.fps <= 0 or not 0 <= args.malformed < 1:
        p.error("--minutes and --fps must be > 0, --cameras >= 1, 0 <= --malformed < 1")
    if args.pid is not None and not args.endpoint:
        p.error("--pid goes with --endpoint (without --endpoint the soak starts its own daemon)")
    return args


def soak(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    own = None if args.endpoint else OwnDaemon(args.frames)
    if own is not None:
        own.start()
    endpoint = args.endpoint or own.endpoint
    proc = own.proc if own is not None else None
    pid = proc.pid if proc is not None else args.pid
    duration = args.minutes * 60.0
    warmup = args.warmup if args.warmup is not None else min(60.0, duration * 0.2)
    report: dict[str, Any] = {"seed": seed, "endpoint": endpoint, "pid": pid,
                              "minutes": args.minutes, "cameras": args.cameras}
    ctx = zmq.Context.instance()
    window = (3, args.frames, 33, 1)
    if own is None:  # learn the model's shape from the daemon
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        sock.send_multipart(encode_request("hello", 1, "soak-monitor"))
        if not sock.poll(10000):
            raise SystemExit(f"soak: no answer from {endpoint} to hello within 10 s")
        hello = decode_reply(sock.recv_multipart())
        sock.close(0)
        window = tuple(next(m for m in hello.result["models"] if m["default"])["input_shape"])
    tally = Tally()
    stop = threading.Event()
    cameras = [Camera(i, endpoint, window, args.fps, args.malformed, tally, stop, seed)
               for i in range(args.cameras)]
    started = time.monotonic()
    for cam in cameras:
        cam.start()
    samples: dict[str, dict[str, int]] = {}
    stalls, reloads, died, ping_id = 0, 0, False, 1000
    next_reload = started + args.reload_every if args.reload_every > 0 else float("inf")
    baseline_at = started + warmup
    reloads_before_baseline = 0 if args.reload_every <= 0 or pid is None else min(
        2, int(duration / args.reload_every) - 1)
    try:
        while time.monotonic() - started < duration:
            time.sleep(PING_EVERY_S)
            if pid is not None and not alive(pid, proc):
                died = True
                break
            ping_id += 1
            if not ping(ctx, endpoint, ping_id, STALL_S):
                stalls += 1
                tally.add("stall", example=f"ping unanswered for {STALL_S} s at "
                                           f"{time.monotonic() - started:.0f} s")
                if stalls >= 3:
                    break
            now = time.monotonic()
            # The baseline comes after the warm-up and after the first two reloads: a reload's
            # first allocations are warm-up too, not growth.
            if pid is not None and "warm" not in samples and now >= baseline_at \
                    and reloads >= reloads_before_baseline:
                samples["warm"] = proc_stats(pid)
            if now >= next_reload and pid is not None:
                if own is not None:
                    own.reload()
                else:
                    os.kill(pid, signal.SIGHUP)
                reloads += 1
                next_reload = now + args.reload_every
        if pid is not None and not died and alive(pid, proc):
            samples["end"] = proc_stats(pid)
    finally:
        stop.set()
        for cam in cameras:
            cam.join(REPLY_TIMEOUT_S + 5)
        exit_code = own.stop() if own is not None else None
    worst = sorted(cam.worst_s * 1e3 for cam in cameras)
    report.update({
        "worst_gap_ms": {"max": round(worst[-1], 1), "median": round(worst[len(worst) // 2], 1)},
        "seconds": round(time.monotonic() - started, 1), "reloads": reloads, "stalls": stalls,
        "daemon_died": died, "samples": samples, "counts": dict(tally.counts),
        "codes": dict(tally.codes), "examples": tally.examples})
    if own is not None:
        report["daemon_exit_code"] = exit_code
        report["daemon_log"] = str(own.log_path)
    report["failures"] = judge(report, args)
    return report


def judge(report: dict[str, Any], args: argparse.Namespace) -> list[str]:
    counts, failures = report["counts"], []
    for key in ("lost", "duplicated", "mismatched"):
        if counts.get(key):
            failures.append(f"{counts[key]} repl{'y' if counts[key] == 1 else 'ies'} {key}")
    if report["codes"].get("internal"):
        failures.append(f"{report['codes']['internal']} internal error(s)")
    if report["daemon_died"]:
        failures.append("the daemon died")
    if report["stalls"]:
        failures.append(f"the daemon stalled ({report['stalls']} ping(s) unanswered)")
    if "daemon_exit_code" in report and report["daemon_exit_code"] != 0:
        failures.append(f"the daemon's exit on SIGTERM: {report['daemon_exit_code']} "
                        "(None: it had to be killed)")
    if not counts.get("replies"):
        failures.append("no replies at all")
    warm, end = report["samples"].get("warm"), report["samples"].get("end")
    if warm and end:
        if end["rss_kb"] - warm["rss_kb"] > args.rss_tolerance_mb * 1024:
            failures.append(f"RSS grew {(end['rss_kb'] - warm['rss_kb']) / 1024:.0f} MB after "
                            f"warm-up (tolerance {args.rss_tolerance_mb:.0f} MB)")
        if end["fds"] - warm["fds"] > args.fd_tolerance:
            failures.append(f"open fds grew {warm['fds']} -> {end['fds']}")
        if end["threads"] - warm["threads"] > args.thread_tolerance:
            failures.append(f"threads grew {warm['threads']} -> {end['threads']}")
    return failures


def print_table(report: dict[str, Any]) -> None:
    out = sys.stdout
    out.write(f"soak of {report['endpoint']} (pid {report['pid']}): {report['cameras']} cameras, "
              f"{report['seconds']} s, {report['reloads']} reloads, seed {report['seed']}\n\n")
    out.write(f"{'':10}{'rss MB':>10}{'fds':>8}{'threads':>9}\n")
    for phase in ("warm", "end"):
        s = report["samples"].get(phase)
        if s:
            out.write(f"{phase:10}{s['rss_kb'] / 1024:>10.1f}{s['fds']:>8}{s['threads']:>9}\n")
    c = report["counts"]
    out.write("\n")
    for key in ("sent", "replies", "predictions", "lost", "duplicated", "mismatched",
                "reconnects"):
        out.write(f"{key:<14}{c.get(key, 0):>10}\n")
    gap = report["worst_gap_ms"]
    out.write(f"\nworst gap per camera (slowest reply): median {gap['median']} ms, "
              f"max {gap['max']} ms\n")
    out.write("replies by code: " + ", ".join(
        f"{k} {v}" for k, v in sorted(report["codes"].items(), key=lambda kv: -kv[1])) + "\n")
    for key, examples in report["examples"].items():
        for e in examples:
            out.write(f"  {key}: {e}\n")
    if report["failures"]:
        out.write("\nFAIL: " + "; ".join(report["failures"]) + "\n")
        if report.get("daemon_log"):
            out.write(f"daemon log: {report['daemon_log']}\n")
    else:
        out.write("\nPASS: no reply lost or duplicated, the daemon served throughout, "
                  "RSS/fds/threads within tolerance\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = soak(args)
    print_table(report)
    if args.json:
        text = json.dumps(report, indent=2, sort_keys=True)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
