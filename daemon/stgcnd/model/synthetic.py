"""Plausible MediaPipe-like skeleton windows, for tests, benchmarks, demos and validation.

Not training data: people standing and swaying with moving arms, normalised image coordinates
in [0, 1], visibility near 1, empty person slots all zero (as a camera pipeline sends them).
Realistic enough that numeric parity and INT8 calibration see the value ranges a deployed model
sees, unlike uniform noise.
"""

from __future__ import annotations

import numpy as np

# A rough frontal MediaPipe pose (x, y) for the 33 landmarks, in a unit box.
_MEDIAPIPE_POSE = np.array([
    (0.50, 0.10), (0.49, 0.09), (0.48, 0.09), (0.47, 0.09), (0.51, 0.09), (0.52, 0.09),
    (0.53, 0.09), (0.45, 0.10), (0.55, 0.10), (0.49, 0.12), (0.51, 0.12),
    (0.42, 0.22), (0.58, 0.22), (0.38, 0.35), (0.62, 0.35), (0.36, 0.47), (0.64, 0.47),
    (0.35, 0.50), (0.65, 0.50), (0.36, 0.50), (0.64, 0.50), (0.37, 0.49), (0.63, 0.49),
    (0.45, 0.52), (0.55, 0.52), (0.45, 0.70), (0.55, 0.70), (0.45, 0.88), (0.55, 0.88),
    (0.44, 0.90), (0.56, 0.90), (0.47, 0.93), (0.53, 0.93),
], dtype=np.float32)


def _template(num_node: int) -> np.ndarray:
    if num_node == len(_MEDIAPIPE_POSE):
        return _MEDIAPIPE_POSE
    # Other layouts: joints spread over a body-sized box in a fixed pseudo-random way.
    rng = np.random.default_rng(num_node)
    return np.stack([rng.uniform(0.35, 0.65, num_node), np.linspace(0.1, 0.9, num_node)], 1)


def synthetic_windows(n: int, frames: int = 150, persons: int = 1, num_node: int = 33,
                      present: int | None = None, seed: int = 0) -> np.ndarray:
    """(n, 3, frames, num_node, persons) float32; `present` persons visible (default: all)."""
    rng = np.random.default_rng(seed)
    present = persons if present is None else min(present, persons)
    pose = _template(num_node)
    out = np.zeros((n, 3, frames, num_node, persons), dtype=np.float32)
    t = np.arange(frames, dtype=np.float32)[:, None] / 25.0
    arms = np.zeros(num_node, dtype=np.float32)
    arms[11:23 if num_node == 33 else num_node] = 1.0
    for i in range(n):
        for p in range(present):
            scale = rng.uniform(0.4, 0.9)
            centre = rng.uniform(0.25, 0.75, size=2)
            freq = rng.uniform(0.3, 1.5)
            phase = rng.uniform(0, 2 * np.pi)
            sway = 0.02 * np.sin(2 * np.pi * freq * t + phase)
            reach = rng.uniform(0.0, 0.15) * np.sin(2 * np.pi * freq * 2 * t + phase) * arms
            x = centre[0] + scale * (pose[:, 0] - 0.5) + sway + reach
            y = centre[1] + scale * (pose[:, 1] - 0.5) + 0.5 * sway - 0.5 * reach
            jitter = rng.normal(0, 0.003, size=(2, frames, num_node))
            out[i, 0, :, :, p] = np.clip(x + jitter[0], 0, 1)
            out[i, 1, :, :, p] = np.clip(y + jitter[1], 0, 1)
            out[i, 2, :, :, p] = np.clip(rng.normal(0.9, 0.08, size=(frames, num_node)), 0, 1)
    return out
