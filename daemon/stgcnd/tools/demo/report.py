"""What the demo's table means, and why cameras ran below their frame rate (with numbers)."""

from __future__ import annotations

import os
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


def explain_rate(load: Load) -> list[str]:
    """Lines saying whether cameras ran below their rate, and why; [] when they kept up."""
    fill_s = WINDOW_FRAMES / load.fps
    if load.compute_ms is None and 0 < load.duration_s <= fill_s:
        return [f"no prediction yet: a window is {WINDOW_FRAMES} frames, {fill_s:.1f} s at "
                f"{load.fps:g} fps, and the cameras ran {load.duration_s:g} s; run longer "
                "(--duration)"]
    if load.achieved_hz >= SLOW_FRACTION * load.fps:
        return [f"cameras kept their rate: {load.achieved_hz:.1f} Hz of {load.fps:g} fps "
                f"(within {100 * (1 - SLOW_FRACTION):.0f} %)"]
    lines = [f"cameras ran at {load.achieved_hz:.1f} Hz, below their {load.fps:g} fps "
             f"(-{100 * (1 - load.achieved_hz / load.fps):.0f}%); within "
             f"{100 * (1 - SLOW_FRACTION):.0f} % counts as kept."]
    if load.compute_ms is None:
        lines.append("  no prediction finished: the daemon did not keep up at all")
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
