"""scripts/zmq_echo_floor.py: the bare ZeroMQ floor, closed loop and paced like a camera."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "zmq_echo_floor.py"


def run(*args: str) -> tuple[str, float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, time.monotonic() - started


def percentiles(out: str) -> list[float]:
    found = re.search(r"p50 ([\d.]+) / p90 ([\d.]+) / p99 ([\d.]+) ms over (\d+) round trips",
                      out)
    assert found, out
    return [float(v) for v in found.groups()]


def test_closed_loop_reports_the_round_trip_and_the_echo_cpu():
    out, _ = run("1200")
    p50, p90, p99, trips = percentiles(out)
    assert 0 < p50 <= p90 <= p99 and trips == 1080  # the first tenth warms up
    assert "one camera closed loop" in out
    assert re.search(r"echo process CPU [\d.]+ us/request over 200 requests", out), out


def test_paced_camera_waits_its_period_between_requests():
    # 40 requests at 100 Hz take at least 0.39 s; back to back they take a few milliseconds.
    out, seconds = run("40", "--rate", "100", "--hold-us", "200")
    assert "one camera at 100 Hz, minus a 200 us hold" in out
    assert percentiles(out)[3] == 36
    assert seconds >= 0.39
    # Fewer requests than the echo's warm-up: its CPU clock would hold start-up, so no figure.
    assert "echo process CPU not measured" in out
