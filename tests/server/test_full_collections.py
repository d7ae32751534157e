"""Full garbage collections are held off while work runs beside the loop (models.in_thread),
and given back as they were when the last such work ends, whatever way it ends."""

from __future__ import annotations

import gc
import threading

import pytest

from stgcnd.server import full_collections
from stgcnd.server.models import in_thread


@pytest.fixture(autouse=True)
def _thresholds_restored():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_inside_no_full_collection_is_due_and_after_the_thresholds_are_back():
    gc.set_threshold(700, 10, 10)
    with full_collections.held_off():
        assert gc.get_threshold() == (700, 10, full_collections.HELD_OFF)
    assert gc.get_threshold() == (700, 10, 10)


def test_overlapping_holders_give_the_thresholds_back_only_when_the_last_ends():
    gc.set_threshold(500, 7, 9)
    first, second = full_collections.held_off(), full_collections.held_off()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # ended first, the other still runs
    assert gc.get_threshold()[2] == full_collections.HELD_OFF
    second.__exit__(None, None, None)
    assert gc.get_threshold() == (500, 7, 9)


def test_work_that_fails_gives_them_back_too():
    gc.set_threshold(700, 10, 10)
    with pytest.raises(ZeroDivisionError), full_collections.held_off():
        raise ZeroDivisionError("the work failed")
    assert gc.get_threshold() == (700, 10, 10)


def test_in_thread_runs_its_work_held_off_and_its_future_sees_them_back():
    gc.set_threshold(700, 10, 10)
    running, release = threading.Event(), threading.Event()

    def work() -> tuple[int, int, int]:
        running.set()
        release.wait(10)
        return gc.get_threshold()

    future = in_thread("test-held-off", work)
    assert running.wait(10)
    assert gc.get_threshold()[2] == full_collections.HELD_OFF  # process-wide, while it runs
    release.set()
    assert future.result(10)[2] == full_collections.HELD_OFF
    assert gc.get_threshold() == (700, 10, 10)  # back before the result was published

    failing = in_thread("test-held-off-fails", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(10)
    assert gc.get_threshold() == (700, 10, 10)
