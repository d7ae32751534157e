"""`stgcnd doctor --config` reports the free memory and budget the daemon's plan starts from
(issue #43, item 3), on the simulated Orin NX 8 GB (tests/board_sim): both computed by
server.models.memory_plan_for from the configuration's memory_reserve_mb and
memory_budget_mb, free memory read one way (MemAvailable)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.board_sim.board import board_env
from tests.server.daemon_harness import FRAMES, Daemon

pytestmark = pytest.mark.slow

# The plan made at start, as the engine is built before READY (with the default `upgrade`, the
# CPU serves first and the plan comes with the background build: tests/server/test_board_upgrade.py)
MODEL = (f'[[models]]\nname = "cam"\ndemo = true\nframes = {FRAMES}\nprecision = "fp16"\n'
         'upgrade = "before-ready"\nlabels = ["normal", "shoplifting"]\n')


@pytest.mark.parametrize("server", [{"memory_reserve_mb": 900},
                                    {"memory_reserve_mb": 0, "memory_budget_mb": 2500}])
def test_doctor_with_the_config_reports_the_daemon_s_plan(tmp_path, server):
    env = board_env(tmp_path, cameras_gb=2, cache_gb=2)
    d = Daemon(tmp_path, env=env, models=MODEL, **server)
    try:
        out = subprocess.run([sys.executable, "-m", "stgcnd", "doctor", "--json", "--config",
                              str(d.config_path)], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        driver = json.loads(out.stdout)["driver"]
        d.start()
        (plan,) = [e for e in d.log_events() if e.get("event") == "memory_plan"]
        assert driver["source"] == "MemAvailable"
        assert driver["reserve_mb"] == plan["reserve_mb"] == server["memory_reserve_mb"]
        assert abs(driver["memory_free_mb"] - plan["free_at_start_mb"]) <= 2
        assert abs(driver["for_models_mb"] - plan["budget_mb"]) <= 2
        assert d.stop() == 0
    finally:
        d.stop()
        d.close()
