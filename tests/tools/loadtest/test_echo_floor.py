"""The bare ZeroMQ floor `stgcnd loadtest --scenario` measures in the same run: real echo and
camera processes, real sockets."""

from __future__ import annotations

import pytest

from stgcnd_tools.loadtest.echo_floor import Echo, closed_loop, measure


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_the_floor_at_a_load_has_round_trips_and_the_echos_cpu(transport):
    # 1 s at 100 Hz: the counts of 2 s at 50 Hz, in half the test's time.
    floor = measure(processes=2, cameras=2, rate_hz=100.0, seconds=1.0, transport=transport,
                    warmup_s=0.25)
    rt = floor.round_trip_ms
    # 4 cameras x 100 Hz x 0.75 s after the warm-up; a reply lost on a busy machine is allowed.
    assert 280 <= rt["count"] <= 300 and 0 < rt["p50"] <= rt["p99"] < 1000
    # The echo counts its CPU after the warm-up's 100 requests: about 300 more.
    assert 280 <= floor.echo_requests <= 310
    assert floor.echo_cpu_us_per_request is not None and floor.echo_cpu_us_per_request > 0
    assert floor.to_dict()["transport"] == transport


def test_too_few_requests_leave_the_echos_cpu_unmeasured():
    with Echo(warm_up=1000) as echo:
        trips = closed_loop(echo.endpoint, 20)
        cpu = echo.stop()
    assert len(trips) == 20 and all(t > 0 for t in trips)
    assert cpu.us_per_request is None  # the clock would hold the echo's start-up too
