"""Serve at once on the board (#45; tests/board_sim): a model with backend "auto" whose
TensorRT engine is not in the store is served at once by ONNX Runtime fp32 on the CPU, READY
is sent while the engine builds in the background build child, and the daemon swaps to the
engine once it is built and validated, a camera served every 0.2 s throughout, within the
memory plan of a 6 GB budget (as tests/server/test_board_memory.py checks it). A build that
fails (the board's failure modes), or that the plan says cannot fit beside what serves,
leaves the CPU serving, one line per attempt, tried again after build_retry_after_s.

The simulated TensorRT succeeds slowly here (board_env's `slow_build_s`): its build is held
until the test releases it, and its engine computes with ONNX Runtime on the ONNX it was
built from, so its answers are checked against the CPU's."""

from __future__ import annotations

import math
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from stgcnd.model.synthetic import synthetic_windows
from stgcnd_client import Client
from stgcnd_client.wire import encode_request
from tests.board_sim.board import FAILURES, Memory, board_env
from tests.server.daemon_harness import FRAMES, Daemon, stop_by_pid
from tests.server.test_daemon import raw_request

pytestmark = pytest.mark.slow

MODEL = (f'[[models]]\nname = "cam"\ndemo = true\nframes = {FRAMES}\nprecision = "fp16"\n'
         'labels = ["normal", "shoplifting"]\n')
WINDOW = synthetic_windows(1, FRAMES, 1, seed=3)[0]
BUDGET_MB = 6144


def events(d: Daemon, name: str) -> list[dict]:
    return [e for e in d.log_events() if e.get("event") == name]


def hello(d: Daemon) -> dict:
    reply = raw_request(d.endpoint, encode_request("hello", 1, "probe", None, []))
    return reply["result"]["models"][0]


def ready(d: Daemon) -> Daemon:
    """Started, READY awaited for 120 s (a daemon that builds first would wait on the held
    build: the test fails there rather than after the harness's 180 s)."""
    d.start(wait_ready=False)
    d.notify.wait_for("READY", timeout=120, alive=d.running)
    return d


def wait_log(d: Daemon, event: str, timeout: float, count: int = 1) -> list[dict]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = events(d, event)
        if len(found) >= count:
            return found
        assert d.running(), d.log_path.read_text()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"{count} {event} not within {timeout} s; log:\n"
                         + d.log_path.read_text()[-3000:])


class Camera:
    """One camera infer-ing every 0.2 s until stopped; every reply or error kept."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.logits: list[np.ndarray] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def __enter__(self) -> Camera:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def check_served(self) -> None:
        """No request failed, and it was served throughout (5 replies at least)."""
        assert not self.errors, self.errors[:3]
        assert len(self.logits) >= 5

    def _run(self) -> None:
        with Client(self.endpoint, timeout=30) as client:
            while not self.stop.is_set():
                try:
                    self.logits.append(np.asarray(client.infer(WINDOW).logits))
                except Exception as exc:  # counted: the test is that there are none
                    self.errors.append(repr(exc))
                time.sleep(0.2)


def released_and_swapped(d: Daemon, release: Path) -> dict:
    """The held build released a second into the camera's run; its `model_upgraded` line,
    a second after which the camera stops."""
    time.sleep(1.0)
    release.touch()
    (upgraded,) = wait_log(d, "model_upgraded", 240)
    time.sleep(1.0)
    return upgraded


@pytest.fixture
def board(tmp_path):
    made: list[Daemon] = []

    def make(env: dict[str, str], **server: object) -> Daemon:
        d = Daemon(tmp_path, env=env, models=MODEL, **server)
        made.append(d)
        return d

    yield make
    for d in made:
        stop_by_pid(d)
        d.close()


def test_tensorrt_builds_while_the_cpu_serves_then_swaps_within_the_6_gb_plan(board, tmp_path):
    release = tmp_path / "release-build"
    env = board_env(tmp_path, cameras_gb=3, cache_gb=3, slow_build_s=2, hold_build=release)
    memory = Memory(tmp_path / "board-root")
    d = ready(board(env, memory_budget_mb=BUDGET_MB))
    model = hello(d)  # READY while the engine's build is held: the CPU serves
    assert model["serving"] == {"backend": "onnxruntime", "precision": "fp32", "device": "cpu"}
    assert model["building"]["backend"] == "tensorrt"
    assert not release.exists() and not events(d, "model_upgraded")
    with Camera(d.endpoint) as camera:
        upgraded = released_and_swapped(d, release)
    camera.check_served()
    # The engine computes what the CPU computed (its ONNX, run as the board would run it).
    np.testing.assert_allclose(camera.logits[-1], camera.logits[0], atol=1e-3)
    assert upgraded["before"]["backend"] == "onnxruntime"
    assert upgraded["after"]["backend"] == "tensorrt"
    model = hello(d)
    assert model["serving"]["backend"] == "tensorrt" and model["building"] is None
    (validated,) = [e for e in d.log_events() if e.get("event") == "engine_validated"
                    and e.get("backend") == "tensorrt"] or [None]
    assert validated is None or validated["finite"]  # (validated in the build child)
    assert not events(d, "engine_build_failed")
    # The upgrade's plan: within the 6 GB budget, and what the board gave is what it planned.
    plan = events(d, "memory_plan")[-1]
    assert plan["budget_mb"] <= BUDGET_MB - 640
    assert [p["runtime"] for p in plan["models"]] == ["tensorrt"]
    taken = sum(memory.state()["used"].values())
    assert taken <= plan["budget_mb"] and abs(plan["planned_mb"] - taken) <= 10, (taken, plan)
    assert stop_by_pid(d) == 0


@pytest.mark.parametrize("fail_at", FAILURES)
def test_a_failed_tensorrt_build_leaves_the_cpu_serving_and_is_retried(board, tmp_path,
                                                                        fail_at):
    env = board_env(tmp_path, fail_at)
    d = ready(board(env, build_retry_after_s=1.0, build_attempts=2))
    model = hello(d)  # READY on the CPU, the engine's build left for after it
    assert model["serving"]["device"] == "cpu" and model["building"]["backend"] == "tensorrt"
    failed = wait_log(d, "upgrade_failed", 240, count=2)
    assert [f["attempts"] for f in failed] == [1, 2]
    assert "tried again in 1 s" in failed[0]["action"]
    assert "not tried again" in failed[1]["action"]
    model = hello(d)
    assert model["serving"]["device"] == "cpu" and model["building"] is None
    with Client(d.endpoint) as client:
        assert client.infer(WINDOW).label_name in ("normal", "shoplifting")
    assert "Traceback" not in d.log_path.read_text()
    assert not events(d, "model_upgraded")
    assert stop_by_pid(d) == 0


def test_a_build_that_cannot_fit_beside_what_serves_is_one_line_and_the_cpu_serves(board,
                                                                                   tmp_path):
    env = board_env(tmp_path, slow_build_s=0)
    # 300 MB for the models: less than the builder's 384 MB workspace on a Jetson.
    d = ready(board(env, memory_budget_mb=640 + 300, build_retry_after_s=1.0,
                    build_attempts=2))
    assert hello(d)["building"]["backend"] == "tensorrt"  # READY before any build
    failed = wait_log(d, "upgrade_failed", 240, count=2)
    assert all("failed at memory" in f["error"] and "384 MB workspace" in f["error"]
               for f in failed), failed
    assert not [e for e in events(d, "engine_build_started") if e["backend"] == "tensorrt"]
    with Client(d.endpoint) as client:
        assert client.infer(WINDOW).label_name in ("normal", "shoplifting")
    assert hello(d)["serving"]["device"] == "cpu"
    assert stop_by_pid(d) == 0


def test_a_reload_that_changes_the_engine_serves_the_old_engine_while_the_new_one_builds(
        board, tmp_path):
    """A named TensorRT model (built before READY) is reloaded with max_batch 4 (a new
    engine): the reload is done while the new engine's build is held, the old engine serving
    (TensorRT still: no CPU stand-in for a model that has an engine), then the new one is
    swapped in, a camera served throughout."""
    release = tmp_path / "release-build"
    release.touch()  # the start's build is not held
    env = board_env(tmp_path, cameras_gb=3, cache_gb=3, slow_build_s=1, hold_build=release)
    d = board(env, memory_budget_mb=BUDGET_MB)
    d.config_path.write_text(d.config_path.read_text().replace(
        'precision = "fp16"\n', 'precision = "fp16"\nbackend = "tensorrt"\n'))
    ready(d)
    before = hello(d)
    assert before["serving"]["backend"] == "tensorrt" and before["max_batch"] > 4
    with Camera(d.endpoint) as camera:
        release.unlink()
        d.config_path.write_text(d.config_path.read_text().replace(
            'backend = "tensorrt"\n', 'backend = "tensorrt"\nmax_batch = 4\n'))
        d.notify.skip_seen()
        d.signal(signal.SIGHUP)
        assert "reloaded" in d.notify.wait_for("READY", timeout=60, alive=d.running)["STATUS"]
        model = hello(d)
        assert model["serving"]["backend"] == "tensorrt"
        assert model["max_batch"] == before["max_batch"]
        assert model["building"]["backend"] == "tensorrt"
        upgraded = released_and_swapped(d, release)
    camera.check_served()
    assert upgraded["before"]["backend"] == upgraded["after"]["backend"] == "tensorrt"
    assert max(map(int, upgraded["after"]["compute_ms"])) == 4
    model = hello(d)
    assert model["max_batch"] == 4 and model["building"] is None
    assert stop_by_pid(d) == 0


def paused_for_batch_64(board, tmp_path: Path, **env: object) -> tuple[Daemon, Path]:
    """A named TensorRT model with max_batch 4, served within a budget where batch 64's
    runner (the simulated board's 8 MB a row: 512 MB) fits only with the old runners'
    32 MB back (496 MB beside them once the new engine's 20 MB are loaded: batch 48 fits,
    64 not; 528 MB in their place); its reload to max_batch 64 built but held."""
    release = tmp_path / "release-build"
    release.touch()  # the start's builds are not held
    env_vars = board_env(tmp_path, slow_build_s=1, hold_build=release, **env)
    config = MODEL.replace('precision = "fp16"\n',
                           'precision = "fp16"\nbackend = "tensorrt"\nmax_batch = 4\n')
    first = board(env_vars, memory_budget_mb=BUDGET_MB)
    first.config_path.write_text(first.config_path.read_text().replace(MODEL, config))
    ready(first)  # builds batch 4's engine; what it holds: its plan's total, the fixed part
    plan = events(first, "memory_plan")[-1]
    held_mb = plan["models"][0]["total_mb"] + plan["fixed_mb"]["tensorrt"]
    assert stop_by_pid(first) == 0
    d = board(env_vars, memory_budget_mb=640 + math.ceil(held_mb) + 516, build_attempts=1)
    d.config_path.write_text(d.config_path.read_text().replace(MODEL, config))
    ready(d)
    assert hello(d)["max_batch"] == 4
    release.unlink()
    d.config_path.write_text(d.config_path.read_text().replace("max_batch = 4\n",
                                                               "max_batch = 64\n"))
    d.notify.skip_seen()
    d.signal(signal.SIGHUP)
    assert "reloaded" in d.notify.wait_for("READY", timeout=60, alive=d.running)["STATUS"]
    assert hello(d)["building"]["backend"] == "tensorrt"
    return d, release


def test_an_engine_that_fits_only_where_the_old_runners_are_pauses_them_then_swaps(
        board, tmp_path):
    """The old runners go first: the camera's requests wait in the queue (the pause,
    `upgrade_paused`), the new runners take it; every request is answered, and the new
    runners serve every bucket within the plan."""
    d, release = paused_for_batch_64(board, tmp_path)
    with Camera(d.endpoint) as camera:
        upgraded = released_and_swapped(d, release)
    camera.check_served()
    np.testing.assert_allclose(camera.logits[-1], camera.logits[0], atol=1e-3)
    (paused,) = events(d, "upgrade_paused")
    assert 64 not in paused["buckets_beside"] and paused["buckets_in_place"][-1] == 64
    assert upgraded["paused_ms"] > 0 and max(map(int, upgraded["after"]["compute_ms"])) == 64
    assert hello(d)["max_batch"] == 64 and hello(d)["building"] is None
    assert "paused" not in hello(d)["serving"]
    plan = events(d, "memory_plan")[-1]  # the new runners' plan: batch 64 within it
    assert plan["models"][0]["buckets"][-1] == 64 and plan["planned_mb"] <= plan["budget_mb"]
    assert not events(d, "upgrade_failed")
    assert stop_by_pid(d) == 0


def test_new_runners_that_fail_in_the_pause_give_way_to_the_old_ones_made_again(board,
                                                                                tmp_path):
    """The board cannot make batch 64's context after all: the old engine's runners are
    made again and take the queue, the upgrade is said failed (build_attempts 1: not tried
    again), and the camera never sees an error."""
    d, release = paused_for_batch_64(board, tmp_path, contexts_up_to=32)
    with Camera(d.endpoint) as camera:
        time.sleep(1.0)
        release.touch()
        (ended,) = wait_log(d, "upgrade_pause_ended", 240)
        time.sleep(1.0)
    camera.check_served()
    (failed,) = events(d, "upgrade_failed")
    assert "execution context" in failed["error"] and "not tried again" in failed["action"]
    assert ended["paused_ms"] > 0 and ended["serving"]["backend"] == "tensorrt"
    assert hello(d)["max_batch"] == 4 and hello(d)["building"] is None
    assert not events(d, "model_upgraded")
    with Client(d.endpoint) as client:
        assert client.infer(WINDOW).label_name in ("normal", "shoplifting")
    assert stop_by_pid(d) == 0


def test_a_stop_during_the_pause_answers_the_waiting_requests_shutting_down(board, tmp_path):
    """SIGTERM while the new runners are being made (5 s here): the request waiting in the
    paused model's queue is answered `shutting-down` (not lost), what the upgrade made is
    closed, and the daemon exits 0."""
    d, release = paused_for_batch_64(board, tmp_path, contexts_up_to=32, big_contexts_s=5.0)
    release.touch()
    wait_log(d, "upgrade_paused", 240)
    answers: list[object] = []

    def infer() -> None:
        with Client(d.endpoint, timeout=20) as client:
            try:
                answers.append(client.infer(WINDOW))
            except Exception as exc:  # the reply is the test
                answers.append(exc)
    waiting = threading.Thread(target=infer)
    waiting.start()
    time.sleep(0.5)
    assert not answers and not events(d, "model_upgraded")  # queued in the pause
    assert hello(d)["serving"]["paused"] is True
    d.signal(signal.SIGTERM)
    waiting.join(30)
    assert len(answers) == 1 and "shutting" in str(answers[0]), answers
    assert d.proc is not None and d.proc.wait(60) == 0
    assert not events(d, "upgrade_not_closed") and "Traceback" not in d.log_path.read_text()
