"""The user's board's memory, simulated (tests/board_sim): an Orin NX 8 GB whose memory the
GPU shares with the OS, the page cache and the cameras' processes (issue #31).

- Free memory is the OS's MemAvailable, read one way by the plan and by `doctor`: with a warm
  page cache (MemFree a few hundred MB) and 3 GB taken by cameras, backend "auto" serves
  TensorRT, on JetPack 5.1.2 and 6, for M=1, M=5, and both together; a first start's build
  (its page cache) is not counted as the model's cost.
- The runtime's one-time cost (CUDA 11.4 loads every kernel image eagerly) is a fixed part of
  the plan, paid once, not spread over the buckets: the budget holds.
- TensorRT 8.5/8.6 would initialise cuBLAS, cuBLASLt and cuDNN in the build process and in
  the daemon (~0.4 GB each time, NVIDIA/TensorRT#2217): stgcnd builds without those tactic
  sources, so M=1 then M=5 build one after the other beside the cameras and both serve.
- A build killed by the out-of-memory killer is a failure that is remembered, not rebuilt
  at every restart, and is tried again once more memory is free.

The figures are the simulation's (tests/board_sim/board.py), not a board's."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from stgcnd_client import Client
from tests.board_sim.board import EAGER_MB, ENGINE_MB, TENSORRT, Memory, board_env
from tests.server.daemon_harness import FRAMES, Daemon

pytestmark = pytest.mark.slow


def model(name: str, persons: int) -> str:
    # Built before READY: the start's plan is the subject here (the plan beside a CPU that
    # serves while TensorRT builds is tests/server/test_board_upgrade.py's).
    return (f'[[models]]\nname = "{name}"\ndemo = true\nframes = {FRAMES}\npersons = {persons}\n'
            'precision = "fp16"\nlabels = ["normal", "shoplifting"]\nupgrade = "before-ready"\n')


def events(d: Daemon, name: str) -> list[dict]:
    return [e for e in d.log_events() if e.get("event") == name]


def trt_builds(d: Daemon) -> int:
    return sum(e["backend"] == "tensorrt" for e in events(d, "engine_build_started"))


def serving(d: Daemon) -> dict[str, str]:
    (ready,) = events(d, "ready")[-1:]
    return {name: m["runtime"] for name, m in ready["models"].items()}


@pytest.fixture
def board(tmp_path):
    made: list[Daemon] = []

    def make(models: str, **server: object) -> Daemon:
        d = Daemon(tmp_path, env=env["env"], models=models, **server)
        made.append(d)
        return d

    env: dict[str, dict[str, str]] = {}

    def on(**board_facts: object) -> Memory:
        env["env"] = board_env(tmp_path, **board_facts)  # type: ignore[arg-type]
        return Memory(tmp_path / "board-root")

    make.on = on  # type: ignore[attr-defined]
    yield make
    for d in made:
        d.stop()
        d.close()


@pytest.mark.parametrize("jetpack", ["5.1.2", "6.0"])
@pytest.mark.parametrize("persons", [1, 5])
def test_a_warm_page_cache_and_busy_cameras_still_serve_tensorrt(board, jetpack, persons):
    memory = board.on(jetpack=jetpack, cameras_gb=3, cache_gb=3)
    before = memory.available_mb()
    assert memory.free_mb() < 600  # MemFree: what cuMemGetInfo says on a Jetson
    d = board(model("cam", persons), memory_budget_mb=6144).start()
    assert serving(d) == {"cam": "tensorrt"}, events(d, "backend_fallback")
    (plan,) = events(d, "memory_plan")
    # The plan starts from MemAvailable (within the simulation's rounding), less the reserve.
    assert abs(plan["free_at_start_mb"] - before) <= 2
    assert plan["budget_mb"] == plan["free_at_start_mb"] - 1536
    (placed,) = plan["models"]
    # Measured once the engine existed: the build's 1.5 GB of page cache is not the model's.
    assert placed["loaded_mb"] <= ENGINE_MB + 2
    assert placed["buckets"] == [1, 2, 4, 8]
    assert plan["fixed_mb"]["tensorrt"] == pytest.approx(EAGER_MB[jetpack], abs=5)
    assert d.stop() == 0


def test_two_models_together_within_a_6_gb_budget(board):
    memory = board.on(cameras_gb=3, cache_gb=3)
    d = board(model("one", 1) + model("five", 5), memory_budget_mb=6144).start()
    assert serving(d) == {"one": "tensorrt", "five": "tensorrt"}, (
        events(d, "backend_fallback"), events(d, "memory_plan"))
    (plan,) = events(d, "memory_plan")
    assert [p["buckets"] for p in plan["models"]] == [[1, 2, 4, 8], [1, 2, 4, 8]]
    # The runtime's fixed part is charged once, not per model or bucket.
    assert plan["fixed_mb"] == {"tensorrt": pytest.approx(EAGER_MB["5.1.2"], abs=5)}
    taken = sum(memory.state()["used"].values())
    assert taken <= plan["budget_mb"] and abs(plan["planned_mb"] - taken) <= 10
    # The cameras take 1 GB more once running: the reserve (1536 MB) was kept for that.
    memory.take_for_cameras(1024)
    assert memory.available_mb() >= plan["budget_mb"] - taken + 1536 - 1024 - 5
    with Client(d.endpoint) as c:
        assert c.infer(np.zeros((3, FRAMES, 33, 5), np.float32), model="five").label_name
    assert d.stop() == 0


@pytest.mark.parametrize("jetpack", ["5.1.2", "6.0"])
def test_the_second_build_beside_the_first_model_and_the_cameras_is_not_killed(board, jetpack):
    """The second model's build runs while the first model serves and the cameras hold 3 GB.
    Built with cuBLAS/cuBLASLt/cuDNN (8.x's default tactic sources), the daemon pays ~0.4 GB
    for them at the first engine's load and the second build ~0.4 GB more: on JetPack 5.1.2
    (CUDA 11.4's eager kernel images) that build is killed and M=5 goes to the CPU."""
    memory = board.on(jetpack=jetpack, cameras_gb=3, cache_gb=3)
    d = board(model("one", 1) + model("five", 5), memory_budget_mb=6144).start()
    assert not events(d, "engine_build_failed"), events(d, "engine_build_failed")
    assert serving(d) == {"one": "tensorrt", "five": "tensorrt"}, events(d, "backend_fallback")
    assert trt_builds(d) == 2
    (plan,) = events(d, "memory_plan")
    # Loading each engine initialised no tactic library: only the engine itself.
    assert all(p["loaded_mb"] <= ENGINE_MB + 2 for p in plan["models"]), plan
    taken = sum(memory.state()["used"].values())
    assert taken <= plan["budget_mb"] and abs(plan["planned_mb"] - taken) <= 10
    manifests = [json.loads(p.read_text()) for p in d.engines.rglob("*.json")
                 if "tactic_sources" in p.read_text()]
    assert manifests and all(TENSORRT[jetpack] in json.dumps(m) for m in manifests)
    assert d.stop() == 0


def test_the_fixed_part_is_paid_once_and_the_budget_holds(board):
    """A budget of 760 MB: the first model's runners (700 MB of kernel images and handles,
    then 66 MB) overflow it. The fixed part does not shrink with the buckets: the model is
    remade with the buckets that fit beside it, and the plan counts what the board gave."""
    memory = board.on(cameras_gb=3)
    d = board(model("one", 1) + model("five", 5), memory_budget_mb=640 + 760).start()
    (plan,) = events(d, "memory_plan")
    assert plan["budget_mb"] == 760
    assert serving(d)["one"] == "tensorrt"
    assert plan["models"][0]["buckets"] == [1, 2, 4]
    assert len(events(d, "memory_plan_corrected")) == 1
    taken = sum(memory.state()["used"].values())
    assert taken <= plan["budget_mb"], (taken, plan)  # the budget holds on the board
    assert abs(plan["planned_mb"] - taken) <= 10, (taken, plan)
    assert d.stop() == 0


def test_a_build_killed_by_the_oom_killer_is_remembered_then_retried(board):
    memory = board.on(cameras_gb=3, oom_builds=1)
    d = board(model("cam", 1)).start()
    assert serving(d)["cam"] != "tensorrt"
    build_events = [e for e in d.log_events() if "build" in e.get("event", "")
                    or e.get("event") == "backend_fallback"]
    assert len(events(d, "engine_build_failed")) == 1, build_events
    (failed,) = events(d, "engine_build_failed")
    assert "SIGKILL" in failed["error"] and failed["attempts"] == 1
    assert failed["retry_when_free_mb"] > failed["free_mb"]
    assert d.stop() == 0

    d.start()  # the same memory: not built again (a build runs for minutes on a board)
    assert trt_builds(d) == 1, events(d, "engine_build_started")
    (later,) = events(d, "engine_build_retry_later")
    assert later["retry_after"] and later["retry_when_free_mb"] == failed["retry_when_free_mb"]
    reasons = [e["reason"] for e in events(d, "backend_fallback") if e["runtime"] == "tensorrt"]
    assert "Not building it again now" in reasons[-1] and "attempt 2 of 3" in reasons[-1]
    assert d.stop() == 0

    memory.set(cameras=1024)  # the cameras gave 2 GB back: 25% more is free
    d.start()
    assert len(events(d, "engine_build_retry")) == 1
    assert trt_builds(d) == 2
    assert serving(d) == {"cam": "tensorrt"}
    assert d.stop() == 0


def test_doctor_reads_free_memory_as_the_daemon_does(board, tmp_path):
    board.on(cameras_gb=3, cache_gb=3)
    env = board_env(tmp_path)
    out = subprocess.run([sys.executable, "-m", "stgcnd", "doctor", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    driver = json.loads(out.stdout)["driver"]
    d = board(model("cam", 1)).start()
    (plan,) = events(d, "memory_plan")
    assert driver["source"] == "MemAvailable"
    assert abs(driver["memory_free_mb"] - plan["free_at_start_mb"]) <= 2
    assert abs(driver["for_models_mb"] - plan["budget_mb"]) <= 2
    assert d.stop() == 0
