"""Small models for runtime tests: T=24 frames keeps a CPU forward pass in the milliseconds
(the original's full widths: each backend's numbers are checked at full shape here);
windows and helpers shared by the runtime, runner and TensorRT tests."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from tests.conftest import write_checkpoint

FRAMES = 24


def fp16_tol(ref: np.ndarray) -> float:
    """How far fp16 logits may be from the fp32 reference's `ref`: 2e-2 of the logits' scale
    (max |ref|), since fp16's rounding grows with the activations, which the logits' scale
    follows. An absolute 1e-2 failed once on an H200 (0.0114 on the demo model, logits up to
    5.7). Measured in fp16 on a CPU (T=24): 5.6e-3 of the scale on the tests' model (logits
    up to 0.67: bound 0.013, the windows' logits 0.15-0.22 apart, so a mix-up still fails),
    2.1e-3 on the demo model (bound 0.12)."""
    return 2e-2 * float(np.max(np.abs(ref)))


def parity_tol(precision: str, ref: np.ndarray) -> float:
    """The parity bound of the torch runtime's logits: 1e-4 in fp32 (the contract), fp16's
    relative to the logits' scale (`fp16_tol`)."""
    return 1e-4 if precision == "fp32" else fp16_tol(ref)


@pytest.fixture(scope="session")
def small_model(tmp_path_factory, original_state):
    from stgcnd.model.reference import (
        load_for_inference as load_model,  # needs torch; original_state skips without it
    )

    path = write_checkpoint(tmp_path_factory.mktemp("rt") / "m.pt", original_state)
    return load_model(ModelSpec(checkpoint=path, frames=FRAMES, persons=2, graph_op="einsum"))


@pytest.fixture(scope="session")
def windows(small_model) -> np.ndarray:
    spec = small_model.spec
    # Realistic skeletons, one with an empty person slot.
    return np.concatenate([
        synthetic_windows(3, spec.frames, spec.persons, spec.num_node, seed=11),
        synthetic_windows(1, spec.frames, spec.persons, spec.num_node, present=1, seed=12),
    ])


def resource_counts() -> dict[str, int]:
    gc.collect()
    return {"threads": threading.active_count(), "fds": len(os.listdir("/proc/self/fd"))}


def assert_released(before: dict[str, int]) -> None:
    """Nothing left over since `before`: the same threads, no more descriptors. Fewer is no
    leak: an earlier test's leftovers (a child's pipes, a context) may close meanwhile, as one
    did in a whole-suite run (25 -> 23)."""
    now = resource_counts()
    assert now["threads"] == before["threads"] and now["fds"] <= before["fds"], (before, now)


def run_in_thread(target, timeout: float = 120.0) -> None:
    """Run `target` in a thread of its own and wait for it: device resources made or driven
    by a thread other than the test's, as executors and the I/O loop do."""
    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{target.__name__} did not finish within {timeout} s"


@contextlib.contextmanager
def opened(runtime, buckets: Sequence[int] = (1,), lanes: int = 0) -> Iterator:
    """A runner of `runtime` (as an executor opens it), closed afterwards."""
    runner = runtime.open_runner(buckets, lanes)
    try:
        yield runner
    finally:
        runner.close()
