"""scripts/frames_after_request.py keeps working: one short trial against its own daemon."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "frames_after_request.py"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_one_trial_reports_the_cameras_wait_the_requests_lost_and_the_memory():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--trials", "1", "--frames",
                           "3000000", "--cameras", "2"], capture_output=True, text=True,
                          timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = re.search(r"trial 1: attacker (.+) \(ping answered: True\); cameras' longest wait "
                      r"([\d.]+) s, 0 lost of (\d+); daemon peak (\d+) MB, RSS (\d+) -> (\d+) "
                      r"MB, alive: True", proc.stdout)
    assert found, proc.stdout
    assert int(found.group(3)) > 50  # the cameras were served around the attack
