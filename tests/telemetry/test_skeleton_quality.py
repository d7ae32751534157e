"""Skeleton quality per camera (telemetry/skeleton_quality.py) on realistic windows and
frames: what each share counts, the silent and blocked cameras, one warning per drop."""

from __future__ import annotations

import numpy as np
import pytest

from stgcnd.model.synthetic import synthetic_windows
from stgcnd.telemetry.skeleton_quality import SAMPLE_EVERY, SkeletonQuality


def window(persons=2, present=1, seed=0):
    return synthetic_windows(1, 30, persons, 33, present=present, seed=seed)[0]


def one(q, camera="cam1", cameras=()):
    records = q.drain(list(cameras) or [camera])
    (record,) = [r for r in records if r["camera"] == camera]
    return record


def frames(q, w, camera="cam1"):
    for t in range(w.shape[1]):
        q.add(camera, w[:, t])          # push mode: one (3, V, M) frame at a time


def test_a_clean_camera_is_fully_usable():
    q = SkeletonQuality(sample_every=1)
    w = window()
    assert (w[2, :, :, 0] > 0.5).all()                      # the generator's visibility
    frames(q, w)
    record = one(q)
    assert record["frames"] == 30 and record["no_person"] == 0.0
    assert record["low_visibility"] == 0.0 and record["usable"] == 1.0
    assert record["visibility"] == pytest.approx(float(w[2, :, :, 0].mean()), abs=1e-4)
    assert record["out_of_frame"] == 0.0
    assert not record["silent"] and not record["blocked"]


def test_empty_frames_lost_joints_and_joints_outside_the_picture_are_counted():
    q = SkeletonQuality(visibility_threshold=0.5, sample_every=1)
    w = window()
    w[:, :10] = 0.0                     # nobody in the first 10 of 30 frames
    w[2, 10:, :11, 0] = 0.2             # the face's 11 joints lost in the others
    w[0, 10:, 30:, 0] = 1.3             # the feet's 3 joints right of the picture
    frames(q, w)
    record = one(q)
    assert record["no_person"] == pytest.approx(10 / 30, abs=1e-4)
    assert record["low_visibility"] == pytest.approx(11 / 33, abs=1e-4)
    assert record["out_of_frame"] == pytest.approx(3 / 22, abs=1e-4)
    assert record["usable"] == pytest.approx((20 / 30) * (22 / 33), abs=1e-3)


def test_pixel_coordinates_are_out_of_frame_and_frames_count_alike():
    """The protocol's coordinates are normalised (0..1): pixels were not judged before #34,
    and such a feed went unnoticed."""
    q = SkeletonQuality(sample_every=1)
    frame = window(persons=1)[:, 0] * np.array([1280, 720, 1], np.float32)[:, None, None]
    for _ in range(5):
        q.add("cam1", frame)            # push mode: (3, V, M)
    record = one(q)
    assert record["frames"] == 5 and record["out_of_frame"] == 1.0


def test_a_window_counts_its_newest_frame():
    q = SkeletonQuality(sample_every=1)
    w = window()
    w[:, :-1] = 0.0                     # empty but for the newest frame
    q.add("cam1", w)
    w2 = window()
    w2[:, -1] = 0.0                     # full but for the newest frame
    q.add("cam1", w2)
    record = one(q)
    assert record["frames"] == 2 and record["no_person"] == 0.5


def test_silent_and_blocked_cameras():
    q = SkeletonQuality(sample_every=1)
    q.refused("busy-cam", busy=True, known=True)
    records = q.drain(["quiet-cam", "busy-cam"])
    by = {r["camera"]: r for r in records}
    assert by["quiet-cam"]["silent"] and not by["quiet-cam"]["blocked"]
    assert by["busy-cam"]["blocked"] and by["busy-cam"]["refused_busy"] == 1
    assert by["quiet-cam"]["usable"] is None



def test_the_shares_are_of_every_4th_frame_and_the_counts_stay_exact():
    """The request path copies every SAMPLE_EVERY-th frame (the interval's first included):
    the shares are of those, `frames` and `blocked` count every frame."""
    assert SAMPLE_EVERY == 4
    q = SkeletonQuality()
    w = window()
    sampled = w[:, 0].copy()
    sampled[2] = 0.0                    # the 1st, 5th, 9th...: nobody in them
    for t in range(40):
        q.add("cam1", sampled if t % SAMPLE_EVERY == 0 else w[:, t % 30])
    q.refused("cam1", busy=True, known=True)
    record = one(q)
    assert record["frames"] == 40 and record["sent"] == 41
    assert record["no_person"] == 1.0   # the other 30 frames, never copied, all had a person
    assert record["blocked"] is False and record["refused_busy"] == 1
    q.add("cam1", w[:, 0])              # a new interval: its first frame is sampled
    assert one(q)["no_person"] == 0.0
