"""The user's board, simulated (tests/board_sim): an Orin NX 8 GB on JetPack 5.1.2 whose
TensorRT fails at build, at engine load or at context creation. The daemon with backend
"auto" still reaches READY, on the next runtime, with one `backend_fallback` line per failure
and no traceback; a named backend fails with one line; the memory plan is logged and keeps at
most 8 buckets; a configuration that cannot fit says how many bytes it needs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stgcnd.runtimes import available
from stgcnd_client import Client
from tests.board_sim.board import FAILURES, board_env
from tests.server.daemon_harness import FRAMES, Daemon

pytestmark = pytest.mark.slow

# Built before READY (upgrade = "before-ready"): these tests are about the start's fallback
# chain; serving the CPU while TensorRT builds is tests/server/test_board_upgrade.py's.
AUTO = (f'[[models]]\nname = "cam"\ndemo = true\nframes = {FRAMES}\nprecision = "fp16"\n'
        'labels = ["normal", "shoplifting"]\nupgrade = "before-ready"\n')


def events(d: Daemon, name: str) -> list[dict]:
    return [e for e in d.log_events() if e.get("event") == name]


@pytest.fixture
def board_daemon(tmp_path):
    made: list[Daemon] = []

    def make(fail_at: str, models: str = AUTO, **server: object) -> Daemon:
        d = Daemon(tmp_path, env=board_env(tmp_path, fail_at), models=models, **server)
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()
        d.close()


@pytest.mark.parametrize("fail_at", FAILURES)
def test_auto_falls_back_to_a_cpu_runtime_with_one_line_per_failure(board_daemon, fail_at):
    d = board_daemon(fail_at).start()
    falls = [(e["runtime"], e["step"]) for e in events(d, "backend_fallback")]
    assert falls == [("tensorrt", fail_at), ("torch (CUDA)", "import")], falls
    assert "Traceback" not in d.log_path.read_text()
    (ready,) = events(d, "ready")
    serving = ready["models"]["cam"]
    assert serving["device"] == "cpu"
    if available()["torch"] is None:  # two CPU runtimes: auto measured them
        assert serving["runtime"] in ("onnxruntime", "torch")
        assert serving["why"].startswith("the fastest here (")
    else:  # the base install (no torch): ONNX Runtime alone, nothing to measure against
        assert serving["runtime"] == "onnxruntime"
        assert serving["why"] == "the only CPU runtime here"
    (plan,) = events(d, "memory_plan")  # the plan was made for TensorRT, then given back
    assert plan["models"] == [] and plan["reserve_mb"] == 1536  # a Jetson's default reserve
    (model,) = events(d, "model_ready")
    assert model["max_batch"] <= 8  # a Jetson's auto max_batch
    with Client(d.endpoint) as c:
        reply = c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
        assert reply.label_name in ("normal", "shoplifting")
    assert d.stop() == 0


def test_a_failed_build_is_not_run_again_at_the_next_start(board_daemon):
    d = board_daemon("build").start()
    assert len(events(d, "engine_build_failed")) == 1
    assert d.stop() == 0
    d.start()  # the same configuration: the record in the store says it failed
    assert len(events(d, "engine_build_failed")) == 1  # not built (and failed) again
    reasons = [e["reason"] for e in events(d, "backend_fallback") if e["runtime"] == "tensorrt"]
    assert len(reasons) == 2 and "Not building it again" in reasons[1]
    assert d.stop() == 0


def test_a_named_backend_that_fails_stops_start_up_with_one_line(board_daemon):
    d = board_daemon("context", models=AUTO + 'backend = "tensorrt"\n').start(wait_ready=False)
    assert d.proc.wait(timeout=180) != 0
    text = d.log_path.read_text()
    assert "Traceback" not in text
    errors = [json.loads(line) for line in text.splitlines()
              if '"level": "error"' in line or '"level": "critical"' in line]
    assert any("tensorrt runtime failed at context" in json.dumps(e) for e in errors), errors


def test_a_configuration_that_cannot_fit_is_refused_with_the_bytes_it_needs(board_daemon):
    model = (AUTO.replace(f"frames = {FRAMES}", "frames = 150")
             + 'persons = 5\nbackend = "tensorrt"\n')
    d = board_daemon("build", models=model, memory_budget_mb=40).start(wait_ready=False)
    assert d.proc.wait(timeout=180) != 0
    text = d.log_path.read_text()
    assert "failed at memory" in text and "MB of device memory for a batch of 1" in text
    assert not events(d, "engine_build_started")  # refused before anything was built


def test_a_failed_tensorrt_build_is_one_line_carrying_tensorrts_errors(board_daemon):
    d = board_daemon("build").start()
    (failed,) = events(d, "engine_build_failed")
    assert "Requested amount of GPU memory" in failed["error"]
    assert "Error Code 2: Internal Error" in failed["error"]
    # TensorRT's errors are inside stgcnd's line, not lines of their own (build child included).
    trt_errors = [e for e in d.log_events() if e.get("event") == "tensorrt_log"
                  and e.get("level") in ("error", "critical")]
    assert trt_errors == []
    assert d.stop() == 0
