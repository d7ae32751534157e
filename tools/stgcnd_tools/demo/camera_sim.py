"""Simulated 25 fps cameras driving a daemon through the real client library.

Failures are counted per camera and grouped by cause across cameras at the end, one line per
cause ("8 cameras: no daemon answered at ipc:///... within 5 s (...)"), never a traceback per
camera thread.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import zmq

from stgcnd.model.synthetic import synthetic_windows
from stgcnd_client import Client, ClientError, Expired, Result, ServerError, Timeout
from stgcnd_tools.stats import distribution
from stgcnd_tools.table import table

HELLO_TIMEOUT_S = 5.0  # how long a camera waits for the daemon to answer its hello


@dataclass
class CameraStats:
    camera: str
    latencies_ms: list[float] = field(default_factory=list)
    compute_ms: list[float] = field(default_factory=list)   # the daemon's, per prediction
    replies: int = 0
    predictions: int = 0
    errors: int = 0
    expired: int = 0      # of the errors: answered `expired` (no time for the prediction)
    timed_out: int = 0    # of the errors: no reply within the timeout
    last_error: str = ""
    last_label: str = ""
    started: float = field(default_factory=time.monotonic)
    # cause (stable text, the same for every camera it hits) -> how many times
    causes: Counter[str] = field(default_factory=Counter)

    def failed(self, cause: str) -> None:
        self.errors += 1
        self.causes[cause] += 1
        self.last_error = cause

    def row(self) -> dict[str, object]:
        """The table's row; None where there is no data yet (shown as '-')."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        lat = distribution(self.latencies_ms, ("p50", "p99"))
        return {"camera": self.camera, "replies": self.replies, "predictions": self.predictions,
                "rate_hz": self.replies / elapsed if self.replies else None,
                "p50_ms": lat["p50"], "p99_ms": lat["p99"],
                "compute_ms": distribution(self.compute_ms, ("median",))["median"],
                "errors": self.errors,
                "expired": self.expired, "timed_out": self.timed_out,
                "label": self.last_label or "-", "error_causes": dict(self.causes)}


def run_camera(endpoint: str, camera: str, fps: float, mode: str, duration: float,
               stats: CameraStats, stop: threading.Event, model: str | None = None,
               timeout: float = 5.0, start_delay: float = 0.0) -> None:
    """One camera thread: its own Client (ZeroMQ sockets are per thread). `timeout` is each
    frame's or window's (--timeout); the hello waits HELLO_TIMEOUT_S whatever it is."""
    if stop.wait(start_delay):
        return
    stats.started = time.monotonic()
    try:
        client = Client(endpoint, camera_id=camera, timeout=HELLO_TIMEOUT_S)
    except (ValueError, zmq.ZMQError) as exc:
        stats.failed(f"{endpoint} is not an endpoint a camera can connect to ({exc})")
        return
    with client:
        try:
            info = client.hello()
        except Timeout:
            stats.failed(no_daemon_cause(endpoint, HELLO_TIMEOUT_S))
            return
        except (ClientError, zmq.ZMQError) as exc:
            stats.failed(f"the daemon at {endpoint} refused the camera: {exc}")
            return
        m = next((x for x in info.models if x.name == model), None) if model else \
            next((x for x in info.models if x.default), info.models[0])
        if m is None:
            served = ", ".join(x.name for x in info.models)
            stats.failed(f"the daemon serves no model {model!r} (it serves: {served}); "
                         "pass one of those to --model")
            return
        _, t, v, persons = m.input_shape
        seed = zlib.crc32(camera.encode())  # stable across runs, unlike hash()
        clip = synthetic_windows(1, t, persons, v, seed=seed)[0]  # (3, T, V, M)
        period = 1.0 / fps
        next_at = time.monotonic()
        end = next_at + duration
        i = 0
        while not stop.is_set() and time.monotonic() < end:
            try:
                res: Result | None
                if mode == "window":
                    res = client.infer(np.roll(clip, -i, axis=1), model=m.name, timeout=timeout)
                else:
                    res = client.push(clip[:, i % t], model=m.name, timeout=timeout)
                stats.replies += 1
                if res is not None:
                    stats.predictions += 1
                    stats.latencies_ms.append(res.client_ms)
                    if "compute_ms" in res.timings:
                        stats.compute_ms.append(res.timings["compute_ms"])
                    stats.last_label = res.label_name
            except Timeout:
                stats.timed_out += 1
                stats.failed(f"no reply within the {timeout:g} s timeout (the daemon is "
                             "overloaded, stopped or restarting)")
            except Expired:
                # One cause for all: the daemon's message differs in its numbers every time.
                stats.expired += 1
                stats.failed(f"the daemon answered expired: it could not predict within the "
                             f"{timeout:g} s timeout")
            except ServerError as exc:
                stats.failed(f"the daemon answered {exc.code}: {exc.message}")
            except ClientError as exc:
                stats.failed(f"{type(exc).__name__}: {exc}")
            i += 1
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            else:
                next_at = time.monotonic()  # fell behind: do not burst to catch up


def no_daemon_cause(endpoint: str, timeout: float) -> str:
    """Why a camera could not even say hello, with what to check."""
    where = ""
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        path = Path(endpoint[len("ipc://"):])
        if not path.exists():
            where = f": {path} does not exist"
        elif not os.access(path, os.R_OK | os.W_OK):
            return (f"no permission to connect to {path}: add this user to the socket's group "
                    "(stgcnd under systemd) and log in again")
    return (f"no daemon answered at {endpoint} within {timeout:g} s{where} (is `stgcnd serve` "
            "running? its \"ready\" log line names the endpoint it listens on)")


def failure_lines(rows: list[dict[str, object]]) -> list[str]:
    """One line per cause, grouped across cameras: '8 cameras: <cause>'."""
    cameras: dict[str, list[str]] = {}
    counts: Counter[str] = Counter()
    for row in rows:
        for cause, count in dict(row.get("error_causes") or {}).items():  # type: ignore[call-overload]
            cameras.setdefault(cause, []).append(str(row["camera"]))
            counts[cause] += int(count)
    lines = []
    for cause, names in cameras.items():
        who = f"{len(names)} cameras" if len(names) > 1 else names[0]
        if len(names) != len(rows) and len(names) > 1:
            who += f" ({', '.join(names)})"
        times = f" ({counts[cause]} requests)" if counts[cause] > len(names) else ""
        lines.append(f"{who}: {cause}{times}")
    return lines


def format_table(rows: list[dict[str, object]]) -> str:
    return "\n".join(table(
        ("camera", "replies", "preds", "rate Hz", "p50 ms", "p99 ms", "compute ms", "errors",
         "label"),
        [(r["camera"], r["replies"], r["predictions"], r["rate_hz"], r["p50_ms"], r["p99_ms"],
          r.get("compute_ms"), r["errors"], r["label"]) for r in rows]))


def simulate(endpoint: str, cameras: int = 4, fps: float = 25.0, mode: str = "push",
             duration: float = 20.0, model: str | None = None, out: TextIO | None = None,
             refresh: float = 1.0, err: TextIO | None = None, legend: str = "",
             timeout: float = 5.0) -> list[dict[str, object]]:
    """Run the cameras, each request with `timeout` seconds; print a live table every
    `refresh` seconds (on a terminal); return the final rows.

    The final table goes to `out` (with `legend` under it), then one line per failure cause
    to `err` (stderr).
    """
    out = out or sys.stdout
    stop = threading.Event()
    stats = [CameraStats(f"cam{i + 1}") for i in range(cameras)]
    # Real cameras do not start on the same frame: spread the starts over one second, so that
    # push-mode predictions (every `stride` frames) do not all land at the same moment.
    threads = [threading.Thread(target=run_camera, name=s.camera, daemon=True,
                                args=(endpoint, s.camera, fps, mode, duration, s, stop, model),
                                kwargs={"start_delay": i / cameras, "timeout": timeout})
               for i, s in enumerate(stats)]
    for th in threads:
        th.start()
    live = getattr(out, "isatty", lambda: False)()
    try:
        while any(th.is_alive() for th in threads):
            time.sleep(refresh)
            table = format_table([s.row() for s in stats])
            if live:
                out.write("\x1b[H\x1b[J" + table + ("\n" + legend if legend else "") + "\n")
            out.flush()
    except KeyboardInterrupt:
        stop.set()
    for th in threads:
        th.join(timeout=10)
    rows = [s.row() for s in stats]
    out.write(format_table(rows) + "\n")
    if legend:
        out.write(legend + "\n")
    out.flush()
    err = err or sys.stderr
    for line in failure_lines(rows):
        err.write(line + "\n")
    err.flush()
    return rows
