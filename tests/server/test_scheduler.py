"""The dynamic batcher on its own: round-robin fairness, bounds, the queue delay, closing."""

from __future__ import annotations

import time

import numpy as np

from stgcnd.server.scheduler import Job, Scheduler

WINDOW = np.zeros((3, 4, 33, 1), dtype=np.float32)


def job(camera: str, req_id: int, received: float | None = None) -> Job:
    return Job(b"id", req_id, camera, "demo", "infer", WINDOW, 0,
               time.monotonic() if received is None else received, None)


def test_a_flooding_camera_gets_one_slot_per_batch_while_others_wait():
    s = Scheduler(queue_size=100)
    for i in range(50):
        s.submit(job("flood", i))
    s.submit(job("a", 0))
    batch = s.take(16, time.monotonic())[0]
    assert batch is not None and [j.camera for j in batch] == ["flood", "a"]


def test_a_camera_alone_fills_the_batch():
    s = Scheduler(queue_size=100)
    for i in range(10):
        s.submit(job("solo", i))
    batch = s.take(4, time.monotonic())[0]
    assert batch is not None and [j.req_id for j in batch] == [0, 1, 2, 3]


def test_one_flooding_camera_gets_one_slot_per_pass():
    s = Scheduler(queue_size=100)
    for i in range(50):
        assert s.submit(job("flood", i))
    for cam in ("a", "b", "c"):
        assert s.submit(job(cam, 0))
    batch = s.take(4, time.monotonic())[0]
    assert batch is not None
    # One job each from every camera with work, in arrival order of the cameras.
    assert [j.camera for j in batch] == ["flood", "a", "b", "c"]
    # The quiet cameras are done; the flood alone fills later batches, in its own order.
    rest = s.take(8, time.monotonic())[0]
    assert rest is not None
    assert [j.req_id for j in rest] == list(range(1, 9))


def test_round_robin_resumes_where_the_last_batch_stopped():
    s = Scheduler(queue_size=10)
    for cam in ("a", "b", "c"):
        for i in range(3):
            s.submit(job(cam, i))
    first = s.take(2, time.monotonic())[0]
    second = s.take(2, time.monotonic())[0]
    assert first is not None and second is not None
    assert [j.camera for j in first] == ["a", "b"]
    assert [j.camera for j in second] == ["c", "a"]  # c was skipped by the first batch


def test_queue_bound_is_per_camera():
    s = Scheduler(queue_size=2)
    assert s.submit(job("a", 1)) and s.submit(job("a", 2))
    assert not s.submit(job("a", 3))   # busy for a
    assert s.submit(job("b", 1))       # b is not affected
    assert s.pending == 3 and [j.req_id for j in s.drain() if j.camera == "a"] == [1, 2]


def test_take_is_empty_then_none_once_closed_and_drained():
    s = Scheduler(queue_size=2)
    assert s.take(4, time.monotonic()) == ([], None)
    s.submit(job("a", 1))
    s.close()
    assert not s.submit(job("a", 2))   # closed: refused
    batch = s.take(4, time.monotonic())[0]    # queued work is still handed out
    assert batch is not None and [j.req_id for j in batch] == [1]
    assert s.take(4, time.monotonic())[0] is None


def test_no_delay_by_default():
    s = Scheduler(queue_size=10)
    s.submit(job("a", 1))
    batch, look = s.take(64, time.monotonic())
    assert batch is not None and len(batch) == 1 and look is None


def test_drain_removes_everything():
    s = Scheduler(queue_size=10)
    for i in range(3):
        s.submit(job("a", i))
    s.submit(job("b", 0))
    assert len(s.drain()) == 4
    assert s.pending == 0 and s.take(4, time.monotonic())[0] == []


def test_take_never_waits_and_says_when_to_look_again():
    """A batch, nothing, a time to come back for a fuller batch (max_queue_delay_us,
    counted from the oldest job's arrival), or None once closed and drained."""
    s = Scheduler(queue_size=10, max_queue_delay_us=10_000_000)  # 10 s: waiting it out shows
    now = time.monotonic()
    assert s.take(4, now) == ([], None)
    s.submit(job("a", 0, received=now))
    t0 = time.monotonic()
    jobs, look = s.take(4, now)
    assert time.monotonic() - t0 < 2.0, "take waited"
    assert jobs == [] and look is not None and abs(look - (now + 10.0)) < 1e-9
    for cam in ("b", "c", "d"):
        s.submit(job(cam, 0, received=now))
    jobs, look = s.take(4, now)  # a full batch goes at once, delay or not
    assert jobs is not None and [j.camera for j in jobs] == ["a", "b", "c", "d"] and look is None
    s.submit(job("e", 0, received=now))
    jobs, _ = s.take(4, now + 10.001)  # the oldest job's delay is over
    assert jobs is not None and [j.camera for j in jobs] == ["e"]
    s.submit(job("f", 0, received=now))
    s.close()
    jobs, _ = s.take(4, now)  # closing hands out what is queued, without the delay
    assert jobs is not None and [j.camera for j in jobs] == ["f"]
    assert s.take(4, now) == (None, None)
