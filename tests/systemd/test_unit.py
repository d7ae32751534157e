"""The systemd unit, linted offline (systemd itself is never booted in tests)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "stgcnd.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_verify_is_clean_and_exposure_at_most_4():
    r = subprocess.run(["bash", str(REPO / "systemd" / "verify.sh")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    exposure = float(r.stdout.rsplit("exposure:", 1)[1].split()[0])
    assert exposure <= 4.0


def test_unit_promises_what_the_daemon_does():
    text = UNIT.read_text()
    settings = dict(line.split("=", 1) for line in text.splitlines()
                    if "=" in line and not line.startswith("#"))
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    assert settings["Restart"] == "on-failure"
    # The daemon's drain deadline (drain_timeout, default 10 s) must end before systemd kills.
    from stgcnd.server.config import ServerConfig

    assert ServerConfig().drain_timeout < float(settings["TimeoutStopSec"])
    assert ServerConfig().stall_timeout <= float(settings["WatchdogSec"])
    for forbidden in ("PrivateDevices=yes", "MemoryDenyWriteExecute=yes"):
        assert forbidden not in text  # both break CUDA
    assert "DeviceAllow=/dev/nvmap rw" in text and "DeviceAllow=/dev/nvidiactl rw" in text
    assert "RuntimeDirectory=stgcnd" in text and "StateDirectory=stgcnd" in text
