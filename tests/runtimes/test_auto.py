"""`auto` on a machine without a GPU: the faster CPU runtime, measured once through the
runners the daemon serves with and remembered; and `time_runtimes`, the measurement itself."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from structlog.testing import capture_logs

torch = pytest.importorskip("torch")  # an optional extra: pip install -e ".[torch]"

from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.model.reference import load_for_inference as load_model
from stgcnd.model.reference import reference_logits
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.provision import first_that_serves, open_runtime
from stgcnd.provision.auto import AUTO_CACHE_NAME, time_runtimes
from stgcnd.provision.load import Choice
from stgcnd.runtimes import available, cpu_bf16
from stgcnd.runtimes.noop import NoopRuntime
from stgcnd.runtimes.torch_runtime import TorchRuntime
from tests.runtimes.conftest import opened

no_gpu = pytest.mark.skipif(torch.cuda.is_available() or available()["tensorrt"] is None,
                            reason="with a GPU, auto picks a GPU runtime")


def chosen(model, options, store) -> Choice:
    """The choice auto serves, its runtime closed (as `stgcnd build` takes it)."""
    return first_that_serves(model, "auto", options, store, lambda choice: None)[1]


@no_gpu
def test_auto_measures_both_cpu_runtimes_and_remembers(tmp_path, checkpoint_path):
    # The narrow network: what is checked is the choice and its memory, not the numbers of a
    # full-width one (each allowance exports, validates and times both runtimes, int8 too).
    model = load_model(ModelSpec(checkpoint=checkpoint_path, frames=30))
    store = EngineStore(tmp_path / "engines")
    with capture_logs() as logs:
        runtime = open_runtime(model, "auto", BuildOptions(), store)
    # The winner served is the one measured, not loaded again: it is loaded as often as the
    # loser (once to validate its new artefact, once to be measured).
    loads = [e["backend"] for e in logs if e["event"] == "backend_loaded"]
    assert loads.count("torch") == loads.count("onnxruntime") >= 1, loads
    try:
        assert runtime.info.name in ("torch", "onnxruntime") and runtime.info.device == "cpu"
        x = synthetic_windows(2, 30, 1, seed=4)
        with opened(runtime) as runner:
            got = np.concatenate([runner.run([w]) for w in x])  # max_batch 1 by default
        np.testing.assert_allclose(got, reference_logits(model, x), atol=1e-4)
    finally:
        runtime.close()
    cache_path = tmp_path / "engines" / AUTO_CACHE_NAME
    (entry,) = json.loads(cache_path.read_text()).values()
    timings = entry["fastest_ms"]
    assert set(timings) == {"torch fp32", "onnxruntime fp32"}  # fp32 allows nothing lower
    assert all(v > 0 for v in timings.values())
    assert f"{entry['backend']} {entry['precision']}" == min(timings, key=timings.__getitem__)
    assert entry["precision"] == "fp32" and entry["machine"]["cpus"] >= 1

    # The decision is read back, not re-measured: flip it on disk and it is honoured.
    other = "torch" if entry["backend"] == "onnxruntime" else "onnxruntime"
    cache = json.loads(cache_path.read_text())
    next(iter(cache.values()))["backend"] = other
    cache_path.write_text(json.dumps(cache))
    again = open_runtime(model, "auto", BuildOptions(), store)
    try:
        assert again.info.name == other
    finally:
        again.close()
    # `stgcnd build --rebuild` measures again: the flipped choice is replaced by a new one.
    store.remeasure_auto = True
    chosen(model, BuildOptions(), store)
    store.remeasure_auto = False
    (remeasured,) = json.loads(cache_path.read_text()).values()
    assert remeasured["fastest_ms"] != timings
    assert f"{remeasured['backend']} {remeasured['precision']}" == \
        min(remeasured["fastest_ms"], key=remeasured["fastest_ms"].__getitem__)

    # A lower precision allows more: fp16 adds bf16 where this CPU has it natively, int8
    # adds ONNX Runtime's int8 too; each allowance is its own measurement, the fastest wins.
    # CUDA graphs are for GPUs.
    bf16 = {"torch bf16"} if cpu_bf16() else set()
    for allowed, extra in (("fp16", bf16), ("int8", bf16 | {"onnxruntime int8"})):
        choice = chosen(model, BuildOptions(
            precision=allowed, cuda_graph=True, allow_synthetic_calibration=True), store)
        name, options = choice.backend, choice.options
        entry = next(e for e in json.loads(cache_path.read_text()).values()
                     if e["allowed"] == allowed)
        assert set(entry["fastest_ms"]) == {"torch fp32", "onnxruntime fp32"} | extra
        fastest = min(entry["fastest_ms"], key=entry["fastest_ms"].__getitem__)
        assert f"{name} {options.precision}" == fastest
        assert (options.device, options.cuda_graph) == ("cpu", False)
    assert len(json.loads(cache_path.read_text())) == 3


def test_time_runtimes_measures_each_through_a_runner_and_closes_them(small_model):
    """The fastest batch-1 round of each runtime, through the runners the daemon serves with;
    every runner is closed afterwards (a CPU runner's worker thread too)."""
    shape = small_model.spec.input_shape
    with TorchRuntime(small_model, "fp32", "cpu") as torch_rt:
        runtimes = {"slow": NoopRuntime(shape, 2, compute_us=20_000),
                    "fast": NoopRuntime(shape, 2),
                    "torch": torch_rt}
        threads = threading.active_count()
        times = time_runtimes(runtimes, rounds=2)
        assert threading.active_count() == threads
    assert set(times) == {"slow", "fast", "torch"}
    assert times["slow"] >= 20.0 > times["fast"] >= 0
    assert times["torch"] > 0
