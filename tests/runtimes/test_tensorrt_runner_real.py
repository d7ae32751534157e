"""The TensorRT runtime on a real engine: machines with TensorRT and a GPU only (a Jetson).

Skipped wherever stgcnd's developers can run tests (TensorRT cannot be installed there);
`tests/runtimes/test_tensorrt_runner_gpu.py` runs the same runner with the engine's call
stood in for. The first Jetson deployment runs these (docs/jetson.md, "Verify TensorRT on
your Jetson"): a dynamic-batch engine of the demo model built through the engine store, then
its runners, with and without CUDA graphs, against the fp32 PyTorch reference and against
the same engine run one window at a time.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.engines.conftest import demo_spec
from tests.runtimes.conftest import fp16_tol, run_in_thread

pytestmark = pytest.mark.tensorrt


def _tol(precision: str, ref: np.ndarray) -> float:
    return 1e-3 if precision == "fp32" else fp16_tol(ref)  # fp32: TF32 on Ampere and later


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def engine(request, tmp_path_factory):
    trt = pytest.importorskip("tensorrt")
    from stgcnd.engines.builders.tensorrt import precision_plan
    from stgcnd.engines.options import BuildOptions
    from stgcnd.engines.store import EngineStore
    from stgcnd.errors import UserError
    from stgcnd.model.reference import load_for_inference as load_model
    from stgcnd.model.reference import reference_logits
    from stgcnd.model.synthetic import synthetic_windows
    from stgcnd.runtimes import gpu_present

    if not gpu_present():
        pytest.skip("needs a CUDA GPU")
    precision = request.param
    try:
        precision_plan(trt, precision)
    except UserError as exc:
        pytest.skip(str(exc))
    spec = demo_spec()
    store = EngineStore(tmp_path_factory.mktemp("engines"))
    built = store.prepare(spec, "tensorrt", BuildOptions(
        precision=precision, device="cuda", max_batch=8, dynamic_batch=True,
        workspace_mb=512, opt_level=1))
    model = load_model(spec)
    windows = synthetic_windows(7, spec.frames, spec.persons, spec.num_node, seed=17)
    return built, precision, windows, reference_logits(model, windows)


def _runtime(built, cuda_graph: bool):
    from stgcnd.runtimes.tensorrt_runtime import TensorRTRuntime

    m = built.manifest
    return TensorRTRuntime(built.path, tuple(m["input_shape"]), int(m["num_class"]),
                           int(m.get("max_batch", 1)), built.precision, cuda_graph)


@pytest.mark.parametrize("lanes", [0, 4])
@pytest.mark.parametrize("cuda_graph", [True, False])
def test_runner_matches_the_reference_and_single_windows(engine, cuda_graph, lanes):
    from stgcnd.engines.validate import backend_logits
    from stgcnd.runtimes.base import InWorker

    built, precision, windows, ref = engine
    tol = _tol(precision, ref)
    runtime = _runtime(built, cuda_graph)
    try:
        assert runtime.info.max_batch == 8 and len(runtime.profile_ranges) == 4
        runner = runtime.open_runner((1, 2, 4, 8), lanes=lanes)
        try:
            runner.warm_up(1)
            # Graphs captured: polled by the loop; else computed on a worker thread.
            polled = not isinstance(runner, InWorker)
            assert polled is (cuda_graph and runtime.graph_failure is None)
            ids = [0, 3, 3, 1, 2, 0, 1] if lanes else [0] * 7   # lane 3 twice in a batch
            full = runner.run(list(windows), ids)                # 7 in bucket 8 (padded)
            three = runner.run(list(windows[:3]), ids[:3])
            again = runner.run(list(windows), ids)
            # float16 windows are widened as they are staged: the same as their float32 values.
            rounded = windows[:2].astype(np.float16)
            half = runner.run(list(rounded), ids[:2])
            widened = runner.run(list(rounded.astype(np.float32)), ids[:2])
        finally:
            runner.close()
        single = np.concatenate([backend_logits(runtime, windows[i:i + 1])
                                 for i in range(len(windows))])
    finally:
        runtime.close()
    assert np.max(np.abs(full - ref)) <= tol
    assert np.max(np.abs(three - ref[:3])) <= tol
    assert np.max(np.abs(full - single)) <= tol
    np.testing.assert_allclose(half, widened, rtol=0, atol=tol / 10)
    np.testing.assert_allclose(full, again, rtol=0, atol=tol / 10)


def test_runner_driven_from_the_loops_thread(engine):
    """As the I/O loop drives it: prepared in one thread, attached, launched, polled and
    collected in another, closed there."""
    built, precision, windows, ref = engine
    runtime = _runtime(built, cuda_graph=True)
    made: dict = {}
    out: list = []
    errors: list = []

    def prepare() -> None:
        made["runner"] = runner = runtime.open_runner((1, 2, 4, 8), lanes=4)
        runner.warm_up(1)

    def drive() -> None:
        runner = made["runner"]
        try:
            runner.attach()
            for lanes in ([1, 1, 3], [0, 1, 2, 3, 0, 2, 1], [2]):
                runner.launch(list(windows[:len(lanes)]), lanes)
                end = time.monotonic() + 10
                while not runner.done() and time.monotonic() < end:
                    time.sleep(0.0002)
                out.append(runner.collect())
        except BaseException as exc:
            errors.append(exc)
        finally:
            runner.close()

    try:
        run_in_thread(prepare)
        run_in_thread(drive)
    finally:
        runtime.close()
    assert not errors, errors
    assert [len(o) for o in out] == [3, 7, 1]
    for o in out:
        assert np.max(np.abs(o - ref[:len(o)])) <= _tol(precision, ref)
