"""What the demo's table means, and its verdict from what came back: whether every camera got
predictions (if not, why and what to change), whether the cameras kept their rate (if not, why,
with numbers), and the events that happened."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

LEGEND = """\
columns: replies = frames (push) or windows (window mode) the daemon answered;
  preds = predictions (push mode: one per `stride` frames once 150 frames are buffered);
  rate Hz = replies per second achieved (the camera's target is its fps);
  p50/p99 ms = prediction round trip at the camera (median / 99th percentile; - until the
  first prediction); compute ms = the daemon's inference time per window (median);
  errors = failed requests; label = the last predicted class (meaningless for the demo)"""

SLOW_FRACTION = 0.9   # below 90 % of the target rate is worth explaining
WINDOW_FRAMES = 150   # the demo model's window: no prediction before this many frames


@dataclass(frozen=True)
class Load:
    cameras: int
    fps: float
    windows_per_s: float        # predictions the cameras ask for, all together
    compute_ms: float | None    # the daemon's median compute time per window
    achieved_hz: float          # mean over cameras
    latency_ms: float | None    # median prediction round trip at the camera
    duration_s: float = 0.0     # how long the cameras ran (0: unknown)


@dataclass(frozen=True)
class Outcome:
    """What came back to the cameras, all together."""

    cameras: int
    predictions: int
    without_predictions: tuple[str, ...]  # the cameras that got none
    expired: int                # requests answered `expired`
    timed_out: int              # requests with no reply within the timeout
    busy: int                   # requests answered `busy`
    other_errors: int

    @property
    def overload(self) -> int:
        """Answers a saturated daemon gives by design (deadline passed in its queue, queue
        full): they do not fail a demo whose cameras all got predictions."""
        return self.expired + self.busy

    @property
    def failures(self) -> int:
        """The other failed requests: they fail the demo."""
        return self.timed_out + self.other_errors


def prediction_verdict(outcome: Outcome, timeout_s: float, fps: float, duration_s: float,
                       push: bool = True) -> str | None:
    """None when every camera got predictions; else one line: which did not, why, and what
    to change. A demo without predictions has failed, whatever the rate of its replies.
    `push`: the cameras pushed frames (no prediction before a window's worth)."""
    missing = outcome.without_predictions
    if not missing:
        return None
    who = ("no camera got a prediction" if len(missing) == outcome.cameras else
           f"{len(missing)} of {outcome.cameras} cameras got no prediction "
           f"({', '.join(missing)})")
    fill_s = WINDOW_FRAMES / fps
    if push and 0 < duration_s <= fill_s:
        return (f"{who}: a window is {WINDOW_FRAMES} frames, {fill_s:.1f} s at {fps:g} fps, "
                f"and the cameras ran {duration_s:g} s; run longer (--duration)")
    if outcome.expired or outcome.timed_out:
        return (f"{who}: {outcome.expired} request(s) were answered expired and "
                f"{outcome.timed_out} got no reply within the {timeout_s:g} s timeout, so the "
                "daemon could not answer in time (a saturated CPU, or too short a timeout); "
                "pass a longer --timeout, or ask less of it: fewer --cameras or a larger "
                "--stride")
    if outcome.busy:
        return (f"{who}: {outcome.busy} request(s) were refused as busy (the cameras' queues "
                "in the daemon were full); ask less of it: fewer --cameras, a larger --stride "
                "or a lower --fps")
    if outcome.other_errors:
        return f"{who}: their requests failed (the causes above)"
    return f"{who}, although the daemon answered every frame; see the daemon's log"


def events_line(started: int, ended: Counter[str], predictions: int) -> str:
    """The demo's events, as they happened (`ended`: how many ended, by reason)."""
    if not started:
        if not predictions:
            return "events: none (no prediction came back, so none could start)"
        return ("events: none started (an event needs predictions of its class over "
                "min_duration_s, 1 s in the demo)")
    line = f"events: {started} started, {sum(ended.values())} ended"
    if ended and set(ended) == {"shutdown"}:
        return line + (" at the shutdown, which ends every open event (the demo model sees "
                       "its second class in every window)")
    if ended:
        line += " (" + ", ".join(f"{n} {reason}" for reason, n in ended.most_common()) + ")"
    return line


def explain_rate(load: Load) -> list[str]:
    """Lines saying whether cameras ran below their rate, and why; [] when they kept up.
    Only for a run in which every camera got predictions (prediction_verdict)."""
    if load.achieved_hz >= SLOW_FRACTION * load.fps:
        return [f"cameras kept their rate: {load.achieved_hz:.1f} Hz of {load.fps:g} fps "
                f"(within {100 * (1 - SLOW_FRACTION):.0f} %)"]
    lines = [f"cameras ran at {load.achieved_hz:.1f} Hz, below their {load.fps:g} fps "
             f"(-{100 * (1 - load.achieved_hz / load.fps):.0f}%); within "
             f"{100 * (1 - SLOW_FRACTION):.0f} % counts as kept."]
    if load.compute_ms is None:
        lines.append("  the daemon reported no compute time for its predictions")
        return lines
    need_ms = load.windows_per_s * load.compute_ms
    cpus = os.cpu_count() or 1
    if need_ms > 1000.0:
        lines.append(
            f"  why: the CPU is saturated. {load.cameras} cameras ask for "
            f"{load.windows_per_s:.1f} windows/s x {load.compute_ms:.0f} ms of compute per "
            f"window = {need_ms:.0f} ms of compute per second, more than the 1000 ms there are "
            f"(the backend already uses all {cpus} cores for each window).")
    else:
        lines.append(
            f"  why: the daemon's compute is {need_ms:.0f} ms per second "
            f"({load.windows_per_s:.1f} windows/s x {load.compute_ms:.0f} ms) of 1000 ms, but "
            f"each camera waits for its prediction (median round trip "
            f"{load.latency_ms or 0:.0f} ms) before it sends its next frame, and the CPU "
            f"({cpus} cores) is shared with the simulated cameras and other processes.")
    lines.append("  fewer cameras (--cameras), fewer predictions (--stride) or a GPU "
                 "(TensorRT) keep the rate.")
    return lines
