"""The memory plan against a device whose runners take more than the runtime estimates: the
budget holds (server/memory_plan.py, models._hold_the_budget). The device is simulated by a
counter of free bytes that the runners draw from and give back on close; the daemon-level
path with a simulated board is in test_board.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from stgcnd.errors import RuntimeFailed
from stgcnd.server.memory_plan import CONTEXT_ALLOWANCE, MB, MemoryPlan
from stgcnd.server.models import _hold_the_budget


@dataclass
class Device:
    free: int
    total: int = 8000 * MB

    def info(self) -> tuple[int, int]:
        return self.free, self.total


@dataclass
class Runtime:
    """Estimates 10 MB a batch row; its runners really take `real_per_row` a row."""

    device: Device
    real_per_row: int
    info: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(name="torch"))

    def runner_bytes(self, buckets: list[int]) -> int:
        return 10 * MB * sum(buckets)


class Runner:
    def __init__(self, runtime: Runtime, buckets: list[int]) -> None:
        self.device, self.took = runtime.device, runtime.real_per_row * sum(buckets)
        self.device.free -= self.took

    def close(self) -> None:
        self.device.free += self.took
        self.took = 0


def served_model(runtime: Runtime, buckets: tuple[int, ...], instances: int = 1):
    served = SimpleNamespace(name="m", runtime=runtime, buckets=buckets, max_batch=max(buckets),
                             config=SimpleNamespace(instances=instances), executors=[])

    def start(s) -> None:
        s.executors.extend(Runner(runtime, list(s.buckets)) for _ in range(instances))

    return served, start


def place(plan: MemoryPlan, runtime: Runtime, buckets: tuple[int, ...], instances: int = 1):
    served, start = served_model(runtime, buckets, instances)
    served.buckets = tuple(plan.fit("m", runtime, buckets, instances, loaded_bytes=0))
    before = plan.free_now()
    start(served)
    _hold_the_budget(plan, served, before, start)
    return served


def test_runners_larger_than_estimated_are_remade_within_the_budget():
    device = Device(free=7000 * MB)
    plan = MemoryPlan.for_device(0, 1000, device.info)  # budget: 6000 MB
    runtime = Runtime(device, real_per_row=40 * MB)     # 4 x the estimate
    served = place(plan, runtime, (1, 2, 4, 8, 16, 32, 64, 128))
    # Estimated 2550 MB for all buckets, fits; really 10,200 MB. Remade with what fits at 4x.
    assert served.buckets == (1, 2, 4, 8, 16, 32, 64)
    taken = 7000 * MB - device.free
    assert taken == 40 * MB * 127 <= plan.budget
    assert plan.left >= 0 and plan.placed[-1].runner_bytes == taken


def test_an_estimate_that_holds_changes_nothing():
    device = Device(free=7000 * MB)
    plan = MemoryPlan.for_device(0, 1000, device.info)
    served = place(plan, Runtime(device, real_per_row=10 * MB), (1, 2, 4, 8))
    assert served.buckets == (1, 2, 4, 8) and device.free == 7000 * MB - 150 * MB


def test_second_model_sees_what_the_first_really_took():
    device = Device(free=7000 * MB)
    plan = MemoryPlan.for_device(0, 1000, device.info)
    place(plan, Runtime(device, real_per_row=30 * MB), (1, 2, 4, 8, 16, 32, 64))  # 3810 MB
    second = place(plan, Runtime(device, real_per_row=10 * MB), (1, 2, 4, 8, 16, 32, 64, 128))
    assert plan.left >= 0 and max(second.buckets) < 128
    assert 7000 * MB - device.free <= plan.budget


def test_a_model_whose_batch_of_one_cannot_fit_fails_at_step_memory():
    device = Device(free=1200 * MB)
    plan = MemoryPlan.for_device(0, 1000, device.info)  # budget: 200 MB
    with pytest.raises(RuntimeFailed) as failed:
        place(plan, Runtime(device, real_per_row=500 * MB), (1, 2))
    assert failed.value.step == "memory"


def test_an_explicit_budget_is_nvidia_smi_s_figure():
    device = Device(free=70_000 * MB)
    plan = MemoryPlan.for_device(6144, 0, device.info)
    assert plan.budget == 6144 * MB - CONTEXT_ALLOWANCE
