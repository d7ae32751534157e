"""Load plans: bad options get one-line errors; cameras are dealt to processes as documented."""

from __future__ import annotations

import pytest

from stgcnd.errors import UserError
from stgcnd_tools.loadtest.plan import LoadPlan

EP = "ipc:///tmp/x.sock"


@pytest.mark.parametrize("kwargs, message", [
    ({"endpoint": "localhost:5555"}, "ipc:///path"),
    ({"processes": 0}, "--processes"),
    ({"cameras": 0}, "no cameras"),
    ({"mode": "frames"}, "--mode"),
    ({"rate_hz": 0.0}, "--rate"),
    ({"duration": 0.0}, "--duration"),
    ({"warmup": -1.0}, "--warmup"),
    ({"timeout_ms": 0.0}, "--timeout-ms"),
    ({"join": 2, "join_at": 10.0, "duration": 10.0}, "--join-at"),
    ({"join": 2, "join_window": 0.0}, "--join-window"),
])
def test_bad_options(kwargs, message):
    with pytest.raises(UserError, match=message):
        LoadPlan(**{"endpoint": EP, **kwargs})


def test_cameras_per_process_and_joiners_round_robin():
    plan = LoadPlan(EP, processes=3, cameras=2, join=4, join_at=1.0, warmup=2.0,
                    rate_hz=10.0, run_id="r")
    per = [plan.cameras_of(p) for p in range(3)]
    ids = [c.camera_id for cams in per for c in cams]
    assert len(ids) == len(set(ids)) == plan.total_cameras == 10
    assert [c.camera_id for c in per[0] if c.joining] == ["lt-r-join0", "lt-r-join3"]
    assert [c.camera_id for c in per[2] if c.joining] == ["lt-r-join2"]
    assert sorted(c.index for cams in per for c in cams) == list(range(10))
    joiners = [c for cams in per for c in cams if c.joining]
    assert all(c.start == 3.0 for c in joiners)  # warmup + join_at
    # Open loop: the six starting cameras' first sends spread over one 100 ms period.
    starts = sorted(c.start for cams in per for c in cams if not c.joining)
    assert starts == pytest.approx([i / 6 * 0.1 for i in range(6)])


def test_closed_loop_starts_together_and_join_defaults_to_the_middle():
    plan = LoadPlan(EP, cameras=3, rate_hz=None, join=1, duration=8.0, warmup=1.0)
    assert plan.closed_loop and plan.end == 9.0 and plan.join_time == 5.0
    assert {c.start for c in plan.cameras_of(0) if not c.joining} == {0.0}
    assert LoadPlan(EP).run_id != LoadPlan(EP).run_id  # every run's cameras are new
