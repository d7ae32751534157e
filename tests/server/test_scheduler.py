"""The dynamic batcher on its own: round-robin fairness, bounds, waiting, closing."""

from __future__ import annotations

import threading
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
    batch = s.take(16, timeout=0.1)
    assert batch is not None and [j.camera for j in batch] == ["flood", "a"]


def test_a_camera_alone_fills_the_batch():
    s = Scheduler(queue_size=100)
    for i in range(10):
        s.submit(job("solo", i))
    batch = s.take(4, timeout=0.1)
    assert batch is not None and [j.req_id for j in batch] == [0, 1, 2, 3]


def test_one_flooding_camera_gets_one_slot_per_pass():
    s = Scheduler(queue_size=100)
    for i in range(50):
        assert s.submit(job("flood", i))
    for cam in ("a", "b", "c"):
        assert s.submit(job(cam, 0))
    batch = s.take(4, timeout=0.1)
    assert batch is not None
    # One job each from every camera with work, in arrival order of the cameras.
    assert [j.camera for j in batch] == ["flood", "a", "b", "c"]
    # The quiet cameras are done; the flood alone fills later batches, in its own order.
    rest = s.take(8, timeout=0.1)
    assert rest is not None
    assert [j.req_id for j in rest] == list(range(1, 9))


def test_round_robin_resumes_where_the_last_batch_stopped():
    s = Scheduler(queue_size=10)
    for cam in ("a", "b", "c"):
        for i in range(3):
            s.submit(job(cam, i))
    first = s.take(2, timeout=0.1)
    second = s.take(2, timeout=0.1)
    assert first is not None and second is not None
    assert [j.camera for j in first] == ["a", "b"]
    assert [j.camera for j in second] == ["c", "a"]  # c was skipped by the first batch


def test_queue_bound_is_per_camera():
    s = Scheduler(queue_size=2)
    assert s.submit(job("a", 1)) and s.submit(job("a", 2))
    assert not s.submit(job("a", 3))   # busy for a
    assert s.submit(job("b", 1))       # b is not affected
    assert s.queued("a") == 2 and s.pending == 3


def test_take_times_out_empty_and_returns_none_once_closed_and_drained():
    s = Scheduler(queue_size=2)
    t0 = time.monotonic()
    assert s.take(4, timeout=0.05) == []
    assert time.monotonic() - t0 >= 0.04
    s.submit(job("a", 1))
    s.close()
    assert not s.submit(job("a", 2))   # closed: refused
    batch = s.take(4, timeout=0.05)    # queued work is still handed out
    assert batch is not None and [j.req_id for j in batch] == [1]
    assert s.take(4, timeout=0.05) is None


def test_an_idle_executor_is_woken_by_a_submit():
    s = Scheduler(queue_size=2)
    got: list[float] = []

    def executor() -> None:
        batch = s.take(4, timeout=5.0)
        assert batch
        got.append(time.monotonic())

    t = threading.Thread(target=executor)
    t.start()
    time.sleep(0.05)
    sent = time.monotonic()
    s.submit(job("a", 1))
    t.join(5.0)
    assert got and got[0] - sent < 0.5


def test_a_deferred_submit_waits_for_wake():
    """submit(wake=False) leaves an idle executor asleep until wake(): the I/O loop queues a
    burst of requests and wakes it once, just before it polls (and releases the GIL)."""
    s = Scheduler(queue_size=10)
    got: list[list[Job] | None] = []
    t = threading.Thread(target=lambda: got.append(s.take(4, timeout=5.0)))
    t.start()
    time.sleep(0.05)                 # the executor is waiting in take()
    s.submit(job("a", 1), wake=False)
    s.submit(job("b", 1), wake=False)
    time.sleep(0.3)
    assert not got                   # not woken by the deferred submits
    woken = time.monotonic()
    s.wake()
    t.join(5.0)
    assert got and got[0] is not None and len(got[0]) == 2
    assert time.monotonic() - woken < 1.0   # by wake(), not by take's 5 s timeout
    s.wake()                         # nothing queued, nobody waiting: a no-op


def test_queue_delay_waits_for_a_fuller_batch_but_no_longer_than_the_delay():
    s = Scheduler(queue_size=10, max_queue_delay_us=200_000)
    s.submit(job("a", 1))
    threading.Timer(0.05, lambda: s.submit(job("b", 1))).start()
    t0 = time.monotonic()
    batch = s.take(4, timeout=1.0)
    waited = time.monotonic() - t0
    assert batch is not None and len(batch) == 2
    assert 0.15 <= waited < 0.6           # waited for the delay (from the oldest arrival)
    # A full batch does not wait at all.
    for cam in "abcd":
        s.submit(job(cam, 2))
    t0 = time.monotonic()
    batch = s.take(4, timeout=1.0)
    assert batch is not None and len(batch) == 4
    assert time.monotonic() - t0 < 0.1


def test_no_delay_by_default():
    s = Scheduler(queue_size=10)
    s.submit(job("a", 1))
    t0 = time.monotonic()
    batch = s.take(64, timeout=1.0)
    assert batch is not None and len(batch) == 1
    assert time.monotonic() - t0 < 0.05


def test_drain_removes_everything():
    s = Scheduler(queue_size=10)
    for i in range(3):
        s.submit(job("a", i))
    s.submit(job("b", 0))
    assert len(s.drain()) == 4
    assert s.pending == 0 and s.take(4, timeout=0.01) == []


def test_take_now_never_waits_and_says_when_to_look_again():
    """The loop-driven executors' form: a batch, nothing, a time to come back for a fuller
    batch (max_queue_delay_us), or None once closed and drained."""
    s = Scheduler(queue_size=10, max_queue_delay_us=50_000)
    now = time.monotonic()
    assert s.take_now(4, now) == ([], None)
    s.submit(job("a", 0, received=now))
    t0 = time.monotonic()
    jobs, look = s.take_now(4, now)
    assert time.monotonic() - t0 < 0.02, "take_now waited"
    assert jobs == [] and look is not None and abs(look - (now + 0.05)) < 1e-9
    for cam in ("b", "c", "d"):
        s.submit(job(cam, 0, received=now))
    jobs, look = s.take_now(4, now)  # a full batch goes at once, delay or not
    assert jobs is not None and [j.camera for j in jobs] == ["a", "b", "c", "d"] and look is None
    s.submit(job("e", 0, received=now))
    jobs, _ = s.take_now(4, now + 0.051)  # the oldest job's delay is over
    assert jobs is not None and [j.camera for j in jobs] == ["e"]
    s.submit(job("f", 0, received=now))
    s.close()
    jobs, _ = s.take_now(4, now)  # closing hands out what is queued, without the delay
    assert jobs is not None and [j.camera for j in jobs] == ["f"]
    assert s.take_now(4, now) == (None, None)
