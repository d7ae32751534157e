"""One simulated camera: its own Client, a send loop, and a raw record of every request (the
load test's, and the demo's and camera-sim's, which show a live view over the same records).

Open loop measures from each request's due time (no coordinated omission) and drops a slot
whose whole period passed, as a camera drops frames; closed loop sends on each reply.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stgcnd.model.synthetic import synthetic_windows
from stgcnd_client import Client, ClientError, ServerError, Timeout
from stgcnd_client.errors import BadReply
from stgcnd_tools.loadtest.plan import CameraPlan, LoadPlan

# Columns of a camera's record, one row per request. Times are ms, except `t` (the due time in
# seconds from the run's start). Server timings are NaN where a reply carries none; `message` is
# the daemon's error message ('' on success).
COLUMNS = ("t", "lag_ms", "rtt_ms", "rtt_send_ms", "predicted", "queue_ms", "compute_ms",
           "total_ms", "code", "message")
LOST = "timeout"  # the code of a request whose reply never came within --timeout-ms
# Errors a retry can never fix: the camera records one and stops.
FATAL_CODES = frozenset({"malformed", "unsupported-version", "unknown-op", "unknown-model",
                         "bad-shape", "bad-dtype", "bad-size", "non-finite", "too-large",
                         "bad-reply"})
# Closed loop: pause this long after an error reply, so a refusing daemon is not hot-spun.
ERROR_PAUSE_S = 0.001
WINDOW_VARIANTS = 4


@dataclass(frozen=True)
class ModelTarget:
    """The model the cameras drive, as the daemon's hello describes it."""

    name: str
    input_shape: tuple[int, ...]   # (3, T, V, M)
    stride: int = 1


class RunClock:
    """Seconds since the run's start, shared by the cameras of one process.

    Every process is given the start as a wall-clock instant and turns it into its own
    monotonic reading once, so all processes agree on t = 0 without comparing clocks later.
    """

    def __init__(self) -> None:
        self.start_mono = 0.0
        self.go = threading.Event()

    def start_at(self, start_wall: float) -> None:
        self.start_mono = time.monotonic() + (start_wall - time.time())
        self.go.set()

    def now(self) -> float:
        return time.monotonic() - self.start_mono


def empty_columns() -> dict[str, np.ndarray]:
    return {name: np.array([], dtype=bool if name == "predicted" else object
                           if name in ("code", "message") else np.float64) for name in COLUMNS}


@dataclass
class CameraResult:
    camera_id: str
    joining: bool
    start: float
    columns: dict[str, np.ndarray] = field(default_factory=empty_columns)
    dropped: int = 0                     # open loop: due sends skipped, measured interval only
    first_reply_ms: float | None = None  # from `start` to its first successful reply
    first_prediction_ms: float | None = None
    stopped: str | None = None           # why it stopped early (a fatal error, a crash)
    last_label: str = ""                 # the last prediction's class


def camera_data(plan: LoadPlan, camera: CameraPlan, target: ModelTarget) -> np.ndarray:
    """What the camera sends: windows (n, 3, T, V, M) or frames (T, 3, V, M), contiguous."""
    _, t, v, m = target.input_shape
    seed = plan.seed * 1_000_003 + camera.index
    if plan.mode == "window":
        return synthetic_windows(WINDOW_VARIANTS, t, m, v, seed=seed)
    clip = synthetic_windows(1, t, m, v, seed=seed)[0]
    return np.ascontiguousarray(clip.transpose(1, 0, 2, 3))


class Camera:
    """Runs in its own thread; `result` holds its records once `run` returns."""

    def __init__(self, plan: LoadPlan, camera: CameraPlan, target: ModelTarget,
                 clock: RunClock, stop: threading.Event) -> None:
        self.plan = plan
        self.camera = camera
        self.target = target
        self.clock = clock
        self.stop = stop
        self.data = camera_data(plan, camera, target)
        self.client: Client | None = None
        self.ready = threading.Event()   # connected (cameras present from the start)
        self.result = CameraResult(camera.camera_id, camera.joining, camera.start)
        self.rows: list[tuple[Any, ...]] = []  # COLUMNS, appended as requests complete

    # -- the thread -------------------------------------------------------------------------

    def run(self) -> None:
        try:
            if not self.camera.joining:
                # Connect before the clock starts: cameras present from the start are measured
                # serving, not connecting. Joining cameras connect when they join.
                self._connect().ping(timeout=self.plan.timeout_ms / 1e3)
            self.ready.set()
            self.clock.go.wait()
            if self._sleep_until(self.camera.start):
                if self.client is None:
                    self._connect()
                if self.plan.closed_loop:
                    self._closed_loop()
                else:
                    self._open_loop()
        except ClientError as exc:
            self.result.stopped = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug here must not hang the run: report it
            self.result.stopped = f"crashed: {type(exc).__name__}: {exc}"
        finally:
            self.ready.set()
            if self.client is not None:
                self.client.close()
            self.result.columns = self._columns()

    def _connect(self) -> Client:
        # retries=0 by default: a lost reply is reported as lost, not hidden by a resend.
        self.client = Client(self.plan.endpoint, camera_id=self.camera.camera_id,
                             timeout=self.plan.timeout_ms / 1e3, retries=self.plan.retries,
                             server_key=self.plan.server_key, client_key=self.plan.client_key)
        return self.client

    def _sleep_until(self, t: float) -> bool:
        """False when stopped meanwhile."""
        delay = t - self.clock.now()
        return not self.stop.wait(delay) if delay > 0 else not self.stop.is_set()

    # -- loops ------------------------------------------------------------------------------

    def _open_loop(self) -> None:
        assert self.plan.rate_hz is not None
        period = 1.0 / self.plan.rate_hz
        end, warmup = self.plan.end, self.plan.warmup
        i = 0
        while not self.stop.is_set():
            due = self.camera.start + i * period
            if due >= end:
                return
            now = self.clock.now()
            if now < due:
                if not self._sleep_until(due):
                    return
            elif now - due >= period:
                # The previous reply came after this slot's whole period: drop the slots
                # already past, as a camera drops frames, and send the newest one late.
                missed = int((now - due) / period)
                self.result.dropped += sum(
                    1 for k in range(missed) if warmup <= due + k * period < end)
                i += missed
                continue
            if self._request(i, due) in FATAL_CODES:
                return
            i += 1

    def _closed_loop(self) -> None:
        end = self.plan.end
        i = 0
        while not self.stop.is_set():
            now = self.clock.now()
            if now >= end:
                return
            code = self._request(i, now)
            if code in FATAL_CODES:
                return
            if code and code != LOST and self.stop.wait(ERROR_PAUSE_S):
                return
            i += 1

    # -- one request ------------------------------------------------------------------------

    def _request(self, i: int, due: float) -> str:
        """Send request i (due at `due`), record it; returns its error code ('' on success)."""
        client = self.client
        assert client is not None
        model = self.target.name
        sent = self.clock.now()
        code = message = ""
        result = None
        try:
            if self.plan.mode == "window":
                result = client.infer(self.data[i % len(self.data)], model=model)
            else:
                result = client.push(self.data[i % len(self.data)], model=model)
        except Timeout:
            code = LOST
        except ServerError as exc:
            code, message = exc.code, exc.message
        except BadReply as exc:
            code, message = "bad-reply", str(exc)
        done = self.clock.now()
        timings = result.timings if result is not None else {}
        self.rows.append((due, (sent - due) * 1e3, (done - due) * 1e3, (done - sent) * 1e3,
                           result is not None, timings.get("queue_ms", np.nan),
                           timings.get("compute_ms", np.nan), timings.get("total_ms", np.nan),
                           code, message))
        if result is not None:
            self.result.last_label = result.label_name
        if not code:
            since_start = (done - self.camera.start) * 1e3
            if self.result.first_reply_ms is None:
                self.result.first_reply_ms = since_start
            if result is not None and self.result.first_prediction_ms is None:
                self.result.first_prediction_ms = since_start
        if code in FATAL_CODES:
            self.result.stopped = f"stopped on a {code!r} error that a retry cannot fix"
        return code

    def _columns(self) -> dict[str, np.ndarray]:
        cols = empty_columns()
        for j, name in enumerate(COLUMNS):
            cols[name] = np.array([r[j] for r in self.rows], dtype=cols[name].dtype)
        return cols
