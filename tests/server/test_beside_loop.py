"""While work runs beside the loop (models.in_thread) full garbage collections are held off and,
once the loop serves, the switch interval is the loading one; both are given back as they were
when the last such work ends, whatever way it ends."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from stgcnd.server import beside_loop
from stgcnd.server.models import in_thread


@pytest.fixture(autouse=True)
def _restored():
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    serving = beside_loop._STATE.serving
    yield
    gc.set_threshold(*thresholds)
    sys.setswitchinterval(interval)
    beside_loop._STATE.serving = serving


def test_inside_no_full_collection_is_due_and_after_the_thresholds_are_back():
    gc.set_threshold(700, 10, 10)
    with beside_loop.work():
        assert gc.get_threshold() == (700, 10, beside_loop.HELD_OFF)
    assert gc.get_threshold() == (700, 10, 10)


def test_the_switch_interval_is_the_loops_own_business_until_it_serves():
    beside_loop._STATE.serving = False
    sys.setswitchinterval(0.005)
    with beside_loop.work():  # a first start's load: no loop to give the lock back to
        assert sys.getswitchinterval() == pytest.approx(0.005)
    beside_loop.loop_serves()
    assert sys.getswitchinterval() == pytest.approx(beside_loop.LOOP_SWITCH_S)
    with beside_loop.work():
        assert sys.getswitchinterval() == pytest.approx(beside_loop.LOADING_SWITCH_S)
    assert sys.getswitchinterval() == pytest.approx(beside_loop.LOOP_SWITCH_S)


def test_overlapping_holders_give_everything_back_only_when_the_last_ends():
    gc.set_threshold(500, 7, 9)
    beside_loop.loop_serves()
    first, second = beside_loop.work(), beside_loop.work()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # ended first, the other still runs
    assert gc.get_threshold()[2] == beside_loop.HELD_OFF
    assert sys.getswitchinterval() == pytest.approx(beside_loop.LOADING_SWITCH_S)
    second.__exit__(None, None, None)
    assert gc.get_threshold() == (500, 7, 9)
    assert sys.getswitchinterval() == pytest.approx(beside_loop.LOOP_SWITCH_S)


def test_work_that_fails_gives_them_back_too():
    gc.set_threshold(700, 10, 10)
    beside_loop.loop_serves()
    with pytest.raises(ZeroDivisionError), beside_loop.work():
        raise ZeroDivisionError("the work failed")
    assert gc.get_threshold() == (700, 10, 10)
    assert sys.getswitchinterval() == pytest.approx(beside_loop.LOOP_SWITCH_S)


def test_in_thread_runs_its_work_beside_the_loop_and_its_future_sees_everything_back():
    gc.set_threshold(700, 10, 10)
    beside_loop.loop_serves()
    running, release = threading.Event(), threading.Event()

    def work() -> tuple[tuple[int, int, int], float]:
        running.set()
        release.wait(10)
        return gc.get_threshold(), sys.getswitchinterval()

    future = in_thread("test-beside-loop", work)
    assert running.wait(10)
    assert gc.get_threshold()[2] == beside_loop.HELD_OFF  # process-wide, while it runs
    release.set()
    thresholds, interval = future.result(10)
    assert thresholds[2] == beside_loop.HELD_OFF
    assert interval == pytest.approx(beside_loop.LOADING_SWITCH_S)
    assert gc.get_threshold() == (700, 10, 10)  # back before the result was published
    assert sys.getswitchinterval() == pytest.approx(beside_loop.LOOP_SWITCH_S)

    failing = in_thread("test-beside-loop-fails", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(10)
    assert gc.get_threshold() == (700, 10, 10)
