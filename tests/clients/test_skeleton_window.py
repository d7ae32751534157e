"""SkeletonWindow: stable person slots, leaving and re-entering, zero padding, input forms."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from stgcnd_client import SkeletonWindow

V = 33
LEFT_HIP, RIGHT_HIP = 23, 24
# A fixed body shape: keypoint offsets from the hip midpoint, in units of body size.
SHAPE = np.random.default_rng(0).uniform(-0.5, 0.5, size=(V, 2))
SHAPE[LEFT_HIP] = (-0.05, 0.0)
SHAPE[RIGHT_HIP] = (0.05, 0.0)


# Crowded frames are the point of several tests here; the warning itself is tested once.
pytestmark = pytest.mark.filterwarnings("ignore:.*person slot")


def person(cx: float, cy: float, size: float = 0.2, vis: float = 0.9) -> np.ndarray:
    """A (33, 3) skeleton whose hip midpoint is exactly (cx, cy)."""
    pose = np.empty((V, 3), np.float32)
    pose[:, :2] = np.array([cx, cy]) + SHAPE * size
    pose[:, 2] = vis
    return pose


def slot_pose(frame: np.ndarray, slot: int) -> np.ndarray:
    """The (V, 3) skeleton in one slot of a (3, V, M) frame."""
    return frame[:, :, slot].T


@pytest.mark.parametrize("scale", [1.0, 1000.0])  # normalised and pixel coordinates
def test_two_people_crossing_keep_their_slots(scale):
    steps = 30
    xs = np.linspace(0.2, 0.8, steps)
    track_a = [person(x * scale, 0.45 * scale, 0.2 * scale) for x in xs]
    track_b = [person(x * scale, 0.55 * scale, 0.2 * scale) for x in xs[::-1]]
    win = SkeletonWindow(frames=steps, persons=2)
    order = np.random.default_rng(1).integers(0, 2, steps)
    for t in range(steps):
        people = [track_a[t], track_b[t]]
        if t > 0 and order[t]:  # the detector's order means nothing
            people.reverse()
        win.append(people)
    w = win.window()
    assert w.shape == (3, steps, V, 2) and w.dtype == np.float32
    for t in range(steps):
        np.testing.assert_array_equal(w[:, t, :, 0].T, track_a[t])
        np.testing.assert_array_equal(w[:, t, :, 1].T, track_b[t])


def test_person_leaving_briefly_keeps_the_slot_and_long_absence_frees_it():
    win = SkeletonWindow(frames=20, persons=2, max_missing=3)
    a, b = person(0.3, 0.5), person(0.7, 0.5)
    frames = [win.frame([a, b]) for _ in range(5)]
    # A is missed for two frames: its slot shows A's last pose, B keeps slot 1
    for _ in range(2):
        frames.append(win.frame([b]))
        np.testing.assert_array_equal(slot_pose(frames[-1], 0), a)
        np.testing.assert_array_equal(slot_pose(frames[-1], 1), b)
    # A is back, a little to the right, listed after B: same slot
    a_back = person(0.32, 0.5)
    frames.append(win.frame([b, a_back]))
    np.testing.assert_array_equal(slot_pose(frames[-1], 0), a_back)
    # A leaves for good: held for max_missing frames, then zeros; B never moves
    for i in range(5):
        frames.append(win.frame([b]))
        expected_a = a_back if i < 3 else np.zeros((V, 3), np.float32)
        np.testing.assert_array_equal(slot_pose(frames[-1], 0), expected_a)
        np.testing.assert_array_equal(slot_pose(frames[-1], 1), b)
    assert win.occupied == (False, True)
    # someone enters far away: takes the free slot 0, B stays in slot 1
    c = person(0.9, 0.2)
    frames.append(win.frame([b, c]))
    np.testing.assert_array_equal(slot_pose(frames[-1], 0), c)
    np.testing.assert_array_equal(slot_pose(frames[-1], 1), b)
    # the window is exactly the frames returned, in order
    np.testing.assert_array_equal(win.window()[:, -len(frames) :], np.stack(frames, axis=1))


def test_newcomer_prefers_a_free_slot_over_a_missing_persons_slot():
    win = SkeletonWindow(frames=5, persons=3, max_missing=5)
    a, b, c = person(0.2, 0.5), person(0.5, 0.5), person(0.9, 0.9)
    win.append([a, b])
    frame = win.frame([b, c])  # A missing, C is far from A: C takes the free slot 2
    np.testing.assert_array_equal(slot_pose(frame, 0), a)
    np.testing.assert_array_equal(slot_pose(frame, 1), b)
    np.testing.assert_array_equal(slot_pose(frame, 2), c)


def test_newcomer_takes_a_missing_persons_slot_when_none_is_free():
    win = SkeletonWindow(frames=5, persons=2, max_missing=5)
    a, b, c = person(0.2, 0.5), person(0.5, 0.5), person(0.9, 0.9)
    win.append([a, b])
    frame = win.frame([b, c])
    np.testing.assert_array_equal(slot_pose(frame, 0), c)
    np.testing.assert_array_equal(slot_pose(frame, 1), b)


def test_more_people_than_slots_keeps_the_tracked_one():
    win = SkeletonWindow(frames=3, persons=1)
    a, b = person(0.2, 0.5), person(0.8, 0.5)
    first = win.frame([a, b])
    second = win.frame([b, a])
    np.testing.assert_array_equal(slot_pose(first, 0), a)
    np.testing.assert_array_equal(slot_pose(second, 0), a)


def test_window_is_zero_padded_at_the_front_until_full():
    win = SkeletonWindow(frames=5, persons=1)
    poses = [person(0.1 * i, 0.5) for i in range(1, 8)]
    for pose in poses[:3]:
        win.append([pose])
    assert not win.ready and win.frames_seen == 3
    w = win.window()
    assert w.shape == (3, 5, V, 1)
    assert not w[:, :2].any()
    for t, pose in enumerate(poses[:3]):
        np.testing.assert_array_equal(w[:, 2 + t, :, 0].T, pose)
    for pose in poses[3:]:
        win.append([pose])
    assert win.ready
    w = win.window()
    for t, pose in enumerate(poses[2:]):
        np.testing.assert_array_equal(w[:, t, :, 0].T, pose)
    w[:] = 7  # a copy: the window itself is untouched
    np.testing.assert_array_equal(win.window()[:, -1, :, 0].T, poses[-1])


def test_empty_frames_and_reset():
    win = SkeletonWindow(frames=4, persons=2, max_missing=0)
    win.append([person(0.5, 0.5)])
    win.append(None)
    win.append([])
    w = win.window()
    assert w[:, 1].any() and not w[:, 2:].any()
    win.reset()
    assert win.frames_seen == 0 and not win.window().any() and win.occupied == (False, False)


def test_landmark_objects_and_mediapipe_result_shapes():
    pose = person(0.4, 0.6)
    pose[5, 2] = 0.0
    landmarks = [SimpleNamespace(x=float(x), y=float(y), visibility=float(v)) for x, y, v in pose]
    # visibility unset (None) counts as not visible
    landmarks[5] = SimpleNamespace(x=float(pose[5, 0]), y=float(pose[5, 1]), visibility=None)
    for people in (
        [landmarks],  # MediaPipe Tasks: result.pose_landmarks, one list per person
        SimpleNamespace(landmark=landmarks),  # legacy solution: results.pose_landmarks
        [SimpleNamespace(landmark=landmarks)],
        pose,  # one person as an array
        pose[None],  # (P, V, 3)
    ):
        win = SkeletonWindow(frames=2, persons=1)
        np.testing.assert_allclose(slot_pose(win.frame(people), 0), pose, rtol=1e-6)


def test_bad_people_are_refused_with_the_expected_shape():
    win = SkeletonWindow(frames=2, persons=1)
    with pytest.raises(ValueError, match=r"\(33, 3\)"):
        win.append([np.zeros((17, 3))])
    bad = person(0.5, 0.5)
    bad[3, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        win.append([bad])
    with pytest.raises(ValueError):
        SkeletonWindow(frames=0)


def test_other_keypoint_layouts_use_the_mean_as_centre():
    win = SkeletonWindow(frames=10, persons=2, keypoints=17)
    rng = np.random.default_rng(2)
    shape = rng.uniform(-0.1, 0.1, size=(17, 2))

    def p17(cx, cy):
        pose = np.ones((17, 3), np.float32)
        pose[:, :2] = shape + np.array([cx, cy])
        return pose

    for t in range(10):
        a, b = p17(0.2 + 0.05 * t, 0.4), p17(0.8 - 0.05 * t, 0.6)
        frame = win.frame([b, a] if t % 2 else [a, b])
        np.testing.assert_array_equal(slot_pose(frame, 0), a)
        np.testing.assert_array_equal(slot_pose(frame, 1), b)


def test_default_keeps_the_largest_person_whatever_the_detector_order():
    near, far = person(0.3, 0.6, size=0.4), person(0.8, 0.4, size=0.1)
    for people in ([far, near], [near, far]):
        win = SkeletonWindow(frames=3, persons=1)
        assert win.select == "largest"
        np.testing.assert_array_equal(slot_pose(win.frame(people), 0), near)
        assert win.ignored == 1


def test_largest_counts_only_visible_keypoints():
    # A skeleton spread wide by keypoints the detector itself calls invisible is not "large".
    spread = person(0.3, 0.5, size=0.5)
    spread[:, 2] = 0.0
    spread[:5, 2] = 0.9
    spread[:5, :2] = spread[LEFT_HIP, :2]  # visible part: a point
    solid = person(0.7, 0.5, size=0.2)
    win = SkeletonWindow(frames=3, persons=1)
    np.testing.assert_array_equal(slot_pose(win.frame([spread, solid]), 0), solid)


def test_most_visible_and_first_and_a_score_function():
    big_faint, small_clear = person(0.3, 0.5, 0.4, vis=0.3), person(0.7, 0.5, 0.1, vis=0.95)
    people = [big_faint, small_clear]
    picks = {
        "largest": big_faint,
        "most_visible": small_clear,
        "first": big_faint,
    }
    for select, expected in picks.items():
        win = SkeletonWindow(frames=2, persons=1, select=select)
        np.testing.assert_array_equal(slot_pose(win.frame(people), 0), expected)
    win = SkeletonWindow(frames=2, persons=1, select="first")
    np.testing.assert_array_equal(slot_pose(win.frame(people[::-1]), 0), small_clear)
    # rightmost person first, as a user-supplied rule
    win = SkeletonWindow(frames=2, persons=1, select=lambda pose: float(pose[:, 0].mean()))
    np.testing.assert_array_equal(slot_pose(win.frame(people), 0), small_clear)


def test_selection_keeps_the_best_ranked_seated_in_detector_order():
    sizes = [0.1, 0.3, 0.2, 0.4]
    people = [person(0.2 * (i + 1), 0.5, size) for i, size in enumerate(sizes)]
    win = SkeletonWindow(frames=2, persons=2)
    with pytest.warns(UserWarning, match="4 people in one frame for a window of 2"):
        frame = win.frame(people)
    np.testing.assert_array_equal(slot_pose(frame, 0), people[1])
    np.testing.assert_array_equal(slot_pose(frame, 1), people[3])
    assert win.ignored == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per window, not once per frame
        win.frame(people)
    win.frame(people[1:2])
    assert win.ignored == 0


def test_a_tracked_person_keeps_the_slot_when_a_larger_one_arrives():
    win = SkeletonWindow(frames=4, persons=1)
    small = person(0.2, 0.5, size=0.1)
    win.frame([small])
    frame = win.frame([person(0.7, 0.5, size=0.5), small])
    np.testing.assert_array_equal(slot_pose(frame, 0), small)


def test_unknown_selection_is_refused():
    with pytest.raises(ValueError, match=r"largest.*most_visible.*first"):
        SkeletonWindow(select="biggest")
