"""Device memory, planned before it is taken: every model's buckets against a budget (the
free memory less memory_reserve_mb, or memory_budget_mb), models placed in configuration
order; docs/jetson.md, "The memory plan", says how a model's cost is modelled and corrected."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stgcnd.errors import RuntimeFailed
from stgcnd.log import get_logger
from stgcnd.model.architecture import block_channels
from stgcnd.model.spec import ModelSpec
from stgcnd.runtimes.base import Runtime

log = get_logger(__name__)

MB = 1 << 20
BYTES = {"fp32": 4, "fp16": 2, "int8": 2, "bf16": 2}  # int8 engines keep fp16 layers too
PARTITIONS = 3  # the spatial strategy's subsets; the graph convolution's intermediate is K x
# What the CUDA context and the libraries' handles take before any model (measured on an
# H100 with torch 2.11: docs/performance.md); an explicit memory_budget_mb counts it.
CONTEXT_ALLOWANCE = 640 * MB


def window_bytes(spec: ModelSpec, precision: str) -> int:
    """Activation bytes of one window at the widest layer (its input, its graph
    convolution's K x C intermediate and its output alive at once), both streams of a
    two-stream model at once (they run concurrently on CUDA). An estimate from the model's
    shape, for refusing a configuration before anything is built."""
    t, v, m = spec.frames, spec.num_node, spec.persons
    peak = 0
    for cin, cout, stride, _kind in block_channels(3):
        t_out = (t + stride - 1) // stride
        peak = max(peak, (cin * t + PARTITIONS * cout * t + cout * t_out) * v)
        t = t_out
    streams = 2 if spec.two_stream else 1
    return peak * m * streams * BYTES.get(precision, 4)


def weight_bytes(spec: ModelSpec, precision: str) -> int:
    per_stream = sum(cout * cin * PARTITIONS + cout * cout * 9 + (cout * cin if kind == "conv"
                                                                   else 0)
                     for cin, cout, _s, kind in block_channels(3))
    return per_stream * (2 if spec.two_stream else 1) * BYTES.get(precision, 4)


@dataclass
class Placed:
    model: str
    runtime: str
    buckets: list[int]
    runner_bytes: int          # charged per runner (the estimate times the fitted scale)
    instances: int
    loaded_bytes: int          # what loading the runtime took (weights, engine)
    estimate: int = 0          # the runtime's own figure per runner for these buckets

    @property
    def total(self) -> int:
        return self.loaded_bytes + self.runner_bytes * self.instances


# What this process paid once per runtime (every plan's `fixed`): a later plan (a reload's,
# an upgrade's) under memory_budget_mb, the process's whole figure, counts it as taken; its
# own `fixed` measures only what its runners add.
PAID_FIXED: dict[str, int] = {}


# A model's cost: per runtime a fixed part paid once per process (`fixed`: kernel images,
# library handles, measured as what its first runners took beyond its estimate), per model
# what loading it took (never measured across a build), per runner a part that grows with its
# largest bucket (`Runtime.runner_bytes`) times a scale fitted from measurement. An explicit
# memory_budget_mb is the process's whole figure (nvidia-smi's): CONTEXT_ALLOWANCE comes off it.
@dataclass
class MemoryPlan:
    """The budget, and the models placed in it so far."""

    budget: int                           # bytes the models may take
    free_at_start: int
    total: int
    reserve: int
    free_now: Callable[[], int]           # free bytes now (stgcnd.runtimes.free_memory)
    placed: list[Placed] = field(default_factory=list)
    # Per runtime, its one-time part in this process (kernel images, library handles, lane
    # streams), and the first measurement it came from: (model, took, estimate).
    fixed: dict[str, int] = field(default_factory=dict)
    first: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    # What runners that were closed to be made again still hold (a caching allocator's
    # blocks, compiled kernels): the device's all the same (models._hold_the_budget).
    held: int = 0

    @classmethod
    def for_device(cls, budget_mb: int, reserve_mb: int,
                   memory_info: Callable[[], tuple[int, int]], taken: int = 0) -> MemoryPlan:
        """`taken`: bytes the process holds already for what the plan will place (an
        upgrade's runtime loaded before its runners' plan): free memory is net of them."""
        free, total = memory_info()
        free += taken
        reserve = reserve_mb * MB
        budget = max(free - reserve, 0)
        if budget_mb:  # the process's whole figure (nvidia-smi's): the context's share first
            budget = min(budget, max(budget_mb * MB - CONTEXT_ALLOWANCE, 0))
        return cls(budget, free, total, reserve, lambda: memory_info()[0] + taken)

    @property
    def used(self) -> int:
        return sum(p.total for p in self.placed) + sum(self.fixed.values()) + self.held

    def unaccounted(self) -> int:
        """What the process holds beyond the plan's account: free memory at its start less
        free memory now, less what it placed (on a Jetson also what others took meanwhile)."""
        return self.free_at_start - self.free_now() - self.used

    @property
    def left(self) -> int:
        return self.budget - self.used

    def check_before_build(self, name: str, runtime: str, spec: ModelSpec, precision: str,
                           instances: int) -> None:
        """Refuse a model whose batch of one cannot fit, before minutes of building."""
        need = weight_bytes(spec, precision) + window_bytes(spec, precision) * instances
        if need > self.left:
            raise RuntimeFailed(runtime, "memory", self._no_room(name, need, 1))

    def check_build_beside(self, name: str, runtime: str, spec: ModelSpec, precision: str,
                           instances: int, workspace_mb: int) -> None:
        """Refuse a background build (server/upgrade.py) that cannot fit beside what serves:
        the builder's workspace (it holds it while the models serve; given back when the
        build child exits) plus the model's batch of one, against what is left of a plan
        made with the serving models' memory taken."""
        need = (workspace_mb * MB + weight_bytes(spec, precision)
                + window_bytes(spec, precision) * instances)
        if need > self.left:
            raise RuntimeFailed(runtime, "memory", self._no_room(name, need, 1).replace(
                "for a batch of 1", f"to build (a {workspace_mb} MB workspace) and serve a "
                "batch of 1 beside the models serving"))

    def fit(self, name: str, runtime: Runtime, buckets: Sequence[int], instances: int,
            loaded_bytes: int, scale: float = 1.0) -> list[int]:
        """The buckets of `name` that fit what is left (the largest dropped first), placed.
        `scale`: what the runners were measured to take against the runtime's estimate."""
        kept = self.buckets_that_fit(runtime, buckets, instances, loaded_bytes, scale=scale)
        room = self.left - loaded_bytes
        if not kept:
            need = loaded_bytes + int(runtime.runner_bytes([1]) * scale) * instances
            raise RuntimeFailed(runtime.info.name, "memory", self._no_room(name, need, 1))
        dropped = sorted(set(buckets) - set(kept))
        if dropped:
            log.warning("memory_plan_trimmed", model=name, runtime=runtime.info.name,
                        dropped_buckets=dropped, kept=kept, left_mb=room // MB,
                        hint="raise memory_budget_mb, lower memory_reserve_mb, or set "
                             "buckets/max_batch to what fits")
        self.placed.append(Placed(name, runtime.info.name, kept,
                                  int(runtime.runner_bytes(kept) * scale), instances,
                                  loaded_bytes, runtime.runner_bytes(kept)))
        return kept

    def buckets_that_fit(self, runtime: Runtime, buckets: Sequence[int], instances: int,
                         loaded_bytes: int, freed: int = 0, scale: float = 1.0) -> list[int]:
        """The buckets `fit` would keep (the largest dropped first; none: not even a batch
        of one), placing nothing. `freed`: bytes that go back before the runners are made
        (an upgrade's pause: the serving runners' share)."""
        kept = sorted(set(buckets))
        room = self.left + freed - loaded_bytes
        while kept and int(runtime.runner_bytes(kept) * scale) * instances > room:
            kept.pop()
        return kept

    def measured(self, took: int) -> float:
        """Record what the last placed model's runners took (`took` bytes, all instances);
        returns the per-bucket scale it implies (measured / the runtime's estimate).

        The first runners of a runtime in this process pay its fixed part: what they took
        beyond the estimate is taken as that (the estimate of TensorRT's activations is
        exact). The same model's runners measured again (remade with other buckets) pay no
        fixed part: they give the scale, and the fixed part is what the first measurement
        leaves at that scale. Later models' runners give their own scale."""
        placed = self.placed[-1]
        estimate = max(placed.estimate * placed.instances, 1)
        rt = placed.runtime
        if rt not in self.fixed:
            self.fixed[rt] = max(took - estimate, 0)
            self.first[rt] = (placed.model, took, estimate)
            PAID_FIXED[rt] = max(PAID_FIXED.get(rt, 0), self.fixed[rt])
            per_bucket = min(took, estimate)
        else:
            per_bucket = took
            model, first_took, first_estimate = self.first.get(rt, ("", 0, 0))
            if model == placed.model:
                scale = took / estimate
                self.fixed[rt] = max(first_took - int(first_estimate * scale), 0)
        placed.runner_bytes = per_bucket // placed.instances
        return per_bucket / estimate

    def refit(self, name: str, runtime: Runtime, buckets: Sequence[int], instances: int,
              loaded_bytes: int, took: int) -> list[int]:
        """`name`'s buckets again after its runners took `took` and overflowed: with the
        excess as the runtime's fixed part (already paid), else, where that cannot fit even a
        batch of one, as a per-bucket scale (the fixed part then taken as none)."""
        rt = runtime.info.name
        first_model = self.first[rt][0] if rt in self.first else ""
        if first_model == name and self.fixed.get(rt):
            try:  # its runtime's first runners: the excess may be the fixed part
                return self.fit(name, runtime, buckets, instances, loaded_bytes)
            except RuntimeFailed:
                self.fixed[rt] = 0
        estimate = max(runtime.runner_bytes(sorted(set(buckets))) * instances, 1)
        return self.fit(name, runtime, buckets, instances, loaded_bytes,
                        scale=max(took / estimate, 1.0))

    def _no_room(self, name: str, need: int, batch: int) -> str:
        return (f"model {name!r} needs {need / MB:.0f} MB of device memory for a batch of "
                f"{batch}, and {max(self.left, 0) / MB:.0f} MB of the {self.budget / MB:.0f} MB "
                f"budget are left (free at start {self.free_at_start / MB:.0f} MB, reserve "
                f"{self.reserve / MB:.0f} MB); free memory, lower memory_reserve_mb, or serve "
                "fewer models or persons")

    def log_plan(self) -> None:
        """One line in the cost model's terms: the runtimes' fixed parts, and per model what
        loading it took, per runner at its buckets (and the scale fitted), and its total."""
        log.info("memory_plan", budget_mb=self.budget // MB,
                 free_at_start_mb=self.free_at_start // MB, reserve_mb=self.reserve // MB,
                 total_mb=self.total // MB, planned_mb=self.used // MB,
                 free_now_mb=self.free_now() // MB,
                 fixed_mb={rt: round(b / MB, 1) for rt, b in self.fixed.items()},
                 held_mb=round(self.held / MB, 1),
                 models=[{"model": p.model, "runtime": p.runtime, "buckets": p.buckets,
                          "runner_mb": round(p.runner_bytes / MB, 1),
                          "scale": round(p.runner_bytes / max(p.estimate, 1), 2),
                          "instances": p.instances, "loaded_mb": round(p.loaded_bytes / MB, 1),
                          "total_mb": round(p.total / MB, 1)} for p in self.placed])
