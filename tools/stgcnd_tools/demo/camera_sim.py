"""Simulated 25 fps cameras driving a daemon through the real client library: the load test's
cameras (stgcnd_tools.loadtest.camera) in threads of this process, with the client's retries,
and a live table over their records.

Failures are counted per camera and grouped by cause across cameras at the end, one line per
cause ("8 cameras: no daemon answered at ipc:///... within 5 s (...)"), never a traceback per
camera thread.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import zmq

from stgcnd_client import Client, ClientError, Timeout
from stgcnd_tools.loadtest.camera import FATAL_CODES, LOST, Camera, ModelTarget, RunClock
from stgcnd_tools.loadtest.plan import CameraPlan, LoadPlan
from stgcnd_tools.stats import distribution
from stgcnd_tools.table import table

HELLO_TIMEOUT_S = 5.0  # how long the cameras wait for the daemon to answer their hello
CLIENT_RETRIES = 3     # the client's default: a lost request is resent, as an application would


def hello(plan: LoadPlan) -> ModelTarget | str:
    """The model the cameras drive, or why they cannot (one cause for every camera)."""
    try:
        client = Client(plan.endpoint, camera_id="hello", timeout=HELLO_TIMEOUT_S)
    except (ValueError, zmq.ZMQError) as exc:
        return f"{plan.endpoint} is not an endpoint a camera can connect to ({exc})"
    with client:
        try:
            info = client.hello()
        except Timeout:
            return no_daemon_cause(plan.endpoint, HELLO_TIMEOUT_S)
        except (ClientError, zmq.ZMQError) as exc:
            return f"the daemon at {plan.endpoint} refused the camera: {exc}"
    try:
        m = info.model(plan.model)
    except KeyError:
        served = ", ".join(x.name for x in info.models)
        return (f"the daemon serves no model {plan.model!r} (it serves: {served}); pass one of "
                "those to --model")
    return ModelTarget(m.name, tuple(m.input_shape), m.stride)


def cause(code: str, message: str, timeout: float) -> str:
    """A failed request's cause: stable text, the same for every camera it hits."""
    if code == LOST:
        return (f"no reply within the {timeout:g} s timeout (the daemon is overloaded, stopped "
                "or restarting)")
    if code == "expired":  # one cause for all: the daemon's message differs in its numbers
        return f"the daemon answered expired: it could not predict within the {timeout:g} s timeout"
    return f"the daemon answered {code}: {message}"


def row(camera: Camera, now: float) -> dict[str, object]:
    """The table's row over the camera's records so far; None where there is no data yet."""
    recs = list(camera.rows)
    ok = [r for r in recs if not r[8]]
    preds = [r for r in ok if r[4]]
    causes = Counter(cause(r[8], r[9], camera.plan.timeout_ms / 1e3) for r in recs if r[8])
    if camera.result.stopped and not any(r[8] in FATAL_CODES for r in recs):
        causes[camera.result.stopped] += 1  # it never sent: no hello, a refused connection
    elapsed = max(min(now, camera.plan.end) - camera.camera.start, 1e-9)
    lat = distribution([r[3] for r in preds], ("p50", "p99"))
    computes = [r[6] for r in preds if not np.isnan(r[6])]
    codes = Counter(r[8] for r in recs)
    return {"camera": camera.camera.camera_id, "replies": len(ok), "predictions": len(preds),
            "rate_hz": len(ok) / elapsed if ok else None,
            "p50_ms": lat["p50"], "p99_ms": lat["p99"],
            "compute_ms": distribution(computes, ("median",))["median"],
            "errors": sum(causes.values()), "expired": codes["expired"],
            "timed_out": codes[LOST], "label": camera.result.last_label or "-",
            "error_causes": dict(causes)}


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
             duration: float = 20.0, model: str | None = None, legend: str = "",
             timeout: float = 5.0) -> list[dict[str, object]]:
    """Run the cameras, each request with `timeout` seconds; on a terminal, a live table
    every second; return the final rows. The final table goes to stdout (with `legend`
    under it), then one line per failure cause to stderr."""
    plan = LoadPlan(endpoint, cameras=cameras, mode=mode, rate_hz=fps, duration=duration,
                    warmup=0.0, model=model, timeout_ms=timeout * 1e3, retries=CLIENT_RETRIES)
    clock, stop = RunClock(), threading.Event()
    target = hello(plan)
    # Real cameras do not start on the same frame: spread the starts over one second, so that
    # push-mode predictions (every `stride` frames) do not all land at the same moment.
    # Without a hello they never send: one tiny window each, and the cause as why they stopped.
    cams = [Camera(plan, CameraPlan(f"cam{i + 1}", i, start=i / cameras, joining=False),
                   target if isinstance(target, ModelTarget) else ModelTarget("", (3, 1, 1, 1)),
                   clock, stop) for i in range(cameras)]
    threads = []
    for c in cams:
        if isinstance(target, str):
            c.result.stopped = target
            c.ready.set()
        else:
            threads.append(threading.Thread(target=c.run, name=c.camera.camera_id, daemon=True))
            threads[-1].start()
    for c in cams:
        c.ready.wait(HELLO_TIMEOUT_S + timeout)
    clock.start_at(time.time())
    under = "\n" + legend if legend else ""
    try:
        while any(th.is_alive() for th in threads):
            time.sleep(1.0)
            if sys.stdout.isatty():
                print("\x1b[H\x1b[J" + format_table([row(c, clock.now()) for c in cams]) + under,
                      flush=True)
    except KeyboardInterrupt:
        stop.set()
    for th in threads:
        th.join(timeout=10)
    rows = [row(c, clock.now()) for c in cams]
    print(format_table(rows) + under, flush=True)
    for line in failure_lines(rows):
        print(line, file=sys.stderr, flush=True)
    return rows
