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

from stgcnd.model import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from tests.conftest import write_checkpoint

FRAMES = 24


@pytest.fixture(scope="session")
def small_model(tmp_path_factory, original_state):
    from stgcnd.model import load_model  # needs torch; original_state skips without it

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
