"""The models the daemon serves: configured, built or reused, loaded, and warmed up."""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from stgcnd.engines.retry import BuildRetry
from stgcnd.engines.store import EngineStore
from stgcnd.errors import BuildCancelled, UserError, step_of
from stgcnd.log import get_logger
from stgcnd.model.spec import ModelSpec, check_labels, default_labels
from stgcnd.provision import first_that_serves
from stgcnd.provision.load import Choice
from stgcnd.runtimes.base import Runtime
from stgcnd.server import beside_loop
from stgcnd.server.config import Config, ModelConfig, ServerConfig, check_event_classes
from stgcnd.server.executor import Executor
from stgcnd.server.heap import OwnGrowth
from stgcnd.server.scheduler import Job, Scheduler
from stgcnd.server.serve_now import (
    Pending,
    at_idle_priority,
    current_runners_serve_on,
    serve_now_instead,
    serving,
)
from stgcnd.server.serving_plan import Target, serving_plan

if TYPE_CHECKING:  # loaded by Planner.for_gpu: a CPU-only serve never needs it
    from stgcnd.server.memory_plan import MemoryPlan

T = TypeVar("T")

log = get_logger(__name__)

FRAMES_PER_S = 25  # the cameras' rate stgcnd is made for (MediaPipe Pose windows at 25 fps)


@dataclass
class ServedModel:
    """One configured model: its loaded runtime, its scheduler and its executors.

    The runtime (weights or engine) is loaded, and every executor's runner made and warmed,
    by whichever thread loads the configuration (the main thread at start, the reload thread
    on SIGHUP), before the model serves: nothing device-side is left for a request."""

    config: ModelConfig
    runtime: Runtime
    labels: tuple[str, ...]
    demo: bool
    generation: int
    why: str = ""            # why this runtime serves it (the auto chain's reason)
    buckets: tuple[int, ...] = (1,)   # the batch shapes its runners prepare (memory plan)
    planned_bytes: int = 0   # its place in the memory plan (0: host memory only)
    max_batch: int = 1
    scheduler: Scheduler = field(default_factory=lambda: Scheduler(1), repr=False)
    executors: list[Executor] = field(default_factory=list, repr=False)
    building: Pending | None = None  # what it is upgraded to in the background (serve_now.py)
    # The configuration (ModelConfig.engine) its runners were made for, as themselves or as
    # what serves at once instead: a reload keeps the model when it asks for this again.
    made_for: tuple[object, ...] = ()
    loaded_bytes: int = 0    # of planned_bytes, its runtime's (weights, engine): the rest
    #                          is its runners'
    runtime_kept: bool = False  # an upgrade's pause (server/upgrade.py): retired runners
    #                             whose runtime the model keeps; closing closes them only

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.runtime.info.input_shape)

    def start(self, queue_size: int, lanes: int, warmup_runs: int, wake: Callable[[], None],
              on_fatal: Callable[[BaseException], None]) -> None:
        """Make the executors, each with a runner warmed on every bucket."""
        mc = self.config
        self.scheduler = Scheduler(queue_size, mc.max_queue_delay_us)
        buckets = list(self.buckets)
        for i in range(mc.instances):
            self.executors.append(Executor.prepare(
                self.runtime, self.name, self.labels, i, self.scheduler, buckets, lanes,
                warmup_runs, wake, on_fatal))

    def apply_policy(self, mc: ModelConfig) -> None:
        """A reload changed only serving policy (labels, stride, queue delay): keep the
        runners. Called on the I/O loop, between batches."""
        self.config = mc
        self.labels = labels_for(mc, self.runtime)
        self.scheduler.delay_s = mc.max_queue_delay_us / 1e6
        for ex in self.executors:
            ex.labels = self.labels

    def submit(self, job: Job) -> bool:
        return self.scheduler.submit(job)

    def stop_accepting(self, drain_deadline: float | None = None) -> None:
        """Queued work still runs (until drain_deadline); new work is refused."""
        for ex in self.executors:
            ex.drain_deadline = drain_deadline
        self.scheduler.close()

    @property
    def drained(self) -> bool:
        return not any(ex.alive for ex in self.executors)

    def close(self) -> None:
        """Free the runners (waiting for batches still running), then the runtime."""
        t0 = time.perf_counter()
        for ex in self.executors:
            ex.close()
        if not self.runtime_kept:
            self.runtime.close()
            # how long it took (on the loop, for a retired model: a stall of its passes)
            log.info("model_closed", model=self.name, generation=self.generation,
                     ms=round((time.perf_counter() - t0) * 1e3, 1))

    def describe(self, default: bool) -> dict[str, object]:
        info = self.runtime.info
        return {"name": self.name, "input_shape": list(info.input_shape),
                "num_class": info.num_class, "labels": list(self.labels),
                "backend": info.name, "precision": info.precision, "default": default,
                "stride": self.config.stride, "demo": self.demo, "max_batch": self.max_batch,
                "serving": self._serving(), "building": self._building()}

    def _serving(self) -> dict[str, object]:
        out = serving(self.runtime)
        if not self.executors:  # an upgrade's pause (server/upgrade.py): the queue waits
            out["paused"] = True
        return out

    def _building(self) -> dict[str, object] | None:
        return self.building.describe() if self.building is not None else None

    def stats(self) -> dict[str, object]:
        info = self.runtime.info
        return {"backend": info.name, "precision": info.precision, "device": info.device,
                "max_batch": self.max_batch, "queued": self.scheduler.pending,
                "serving": self._serving(), "building": self._building(),
                "executors": [ex.stats() for ex in self.executors]}


def labels_for(mc: ModelConfig, runtime: Runtime) -> tuple[str, ...]:
    """The configured labels, else those the checkpoint carries, else class_0, class_1..."""
    carried = runtime.info.details.get("labels")
    if not isinstance(carried, (list, tuple)):  # details are free-form; labels are a list
        carried = ()
    return tuple(mc.labels) or tuple(str(x) for x in carried) or \
        default_labels(runtime.info.num_class)


def _check_event_classes(mc: ModelConfig, runtime: Runtime) -> None:
    """The classes [models.events] names are the model's, now that its labels are known (a
    checkpoint without configured labels may carry them: config._check could not tell)."""
    if mc.events is not None:
        check_event_classes(mc.events, labels_for(mc, runtime), f"model {mc.name!r}")


def in_thread(name: str, work: Callable[[], T]) -> Future[T]:
    """Run `work` on a thread of its own; its Future. A daemon thread: a stop abandons a
    build in progress (load_models' cancel) without waiting for it at exit."""
    future: Future[T] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            with beside_loop.work():  # the loop first: no full collection meanwhile
                result = work()
        except BaseException as exc:
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def load_models(config: Config, generation: int = 1,
                keep: dict[str, ServedModel] | None = None,
                start: Callable[[ServedModel], None] | None = None,
                cancel: threading.Event | None = None,
                background: bool = False,
                deferred: dict[str, Pending | None] | None = None
                ) -> dict[str, ServedModel]:
    """Build or reuse every configured model's artefact, load it, and `start` its executors
    (which warm every bucket) before returning.

    Models whose engine keys are unchanged (`keep`) are reused as they are (the caller then
    applies their new policy keys with ServedModel.apply_policy). A model with backend "auto"
    falls back along its chain (provision.auto_chain) when a runtime fails at any step, import
    to warm-up, one `backend_fallback` line each; a named backend that fails, or a chain that
    runs out, is fatal to the whole load: the daemon never serves half a configuration.

    `cancel`: when set (SIGTERM during a first-start build), a running build is abandoned
    within seconds, leaving nothing partial in the store, and BuildCancelled is raised;
    builds then run in a child process (see stgcnd.engines.child_build).

    `background` (the daemon): a model with `upgrade = "background"` whose artefact must be
    built is served at once by a quicker runtime, its upgrade left `building` for the loop
    (server/upgrade.py, `load_upgrade`). With `deferred` (a reload), a model whose new engine
    keys ask for what a start would build in the background, or for a TensorRT engine not in
    the store, and whose runners serve the same model (checkpoint, shape), keeps them
    meanwhile: it is returned as it is, and what it is upgraded to goes into `deferred` (the
    loop sets it as the model's `building` when it applies the reload; None: a reload asked
    for what its runners serve again, and the upgrade under way is off).
    """
    store = EngineStore(config.engines_dir, cancel=cancel,
                        retry=BuildRetry(config.server.build_retry_after_s,
                                         config.server.build_attempts))
    loaded: dict[str, ServedModel] = {}
    planner = Planner(config, keep)
    try:
        for mc in config.models:
            if cancel is not None and cancel.is_set():
                raise BuildCancelled("start-up cancelled")
            old = (keep or {}).get(mc.name)
            building = old.building if old is not None else None
            if old is not None and (old.made_for == mc.engine or (
                    building is not None and building.engine == mc.engine)):
                _check_event_classes(mc, old.runtime)  # the reload's labels, its events
                loaded[mc.name] = old
                if deferred is not None and building is not None and \
                        building.engine not in (None, mc.engine):
                    deferred[mc.name] = None  # asked for what serves: the upgrade is off
                continue
            t0 = time.perf_counter()
            upgrade = background and mc.upgrade == "background"
            served = _first_that_serves(mc, store, generation, start, planner, upgrade,
                                        keeps=old if upgrade and deferred is not None else None,
                                        deferred=deferred)
            loaded[mc.name] = served
            _check_event_classes(mc, served.runtime)
            if served is old:
                upgrade_to = (deferred or {}).get(mc.name)
                assert upgrade_to is not None
                log.info("model_kept_while_building", model=mc.name,
                         serving=serving(old.runtime), building=upgrade_to.describe())
                continue
            info = served.runtime.info
            first = served.executors[0] if served.executors else None
            log.info("model_ready", model=mc.name, backend=info.name, why=served.why,
                     precision=info.precision, device=info.device,
                     input_shape=list(info.input_shape), demo=served.demo,
                     max_batch=served.max_batch, instances=mc.instances,
                     buckets=list(first.buckets) if first else [],
                     compute_ms={str(b): round(v, 3) for b, v in sorted(
                         first.compute_ms.items())} if first else {},
                     seconds=round(time.perf_counter() - t0, 2))
            at_risk = camera_rate_at_risk(mc, first.compute_ms if first else {})
            if at_risk:
                log.warning("camera_rate_at_risk", model=mc.name, **at_risk)
    except BaseException:
        for name, served in loaded.items():
            if (keep or {}).get(name) is not served:
                served.close()
        raise
    planner.log()
    return loaded


class Planner:
    """The load's memory plan (server/memory_plan.py), made when a model first goes to the
    GPU: a CPU-only configuration never touches CUDA for it."""

    def __init__(self, config: Config, keep: dict[str, ServedModel] | None,
                 taken: int = 0) -> None:
        self.config = config
        # On a reload the kept models stay where they are: their bytes are already taken.
        self.kept_bytes = sum(m.planned_bytes for m in (keep or {}).values())
        self.taken = taken  # (MemoryPlan.for_device)
        self.plan: MemoryPlan | None = None

    def for_gpu(self) -> MemoryPlan:
        if self.plan is None:
            self.plan = memory_plan_for(self.config.server, self.kept_bytes, self.taken)
        return self.plan

    def log(self) -> None:
        if self.plan is not None:
            self.plan.log_plan()


def memory_plan_for(server: ServerConfig, kept_bytes: int = 0, taken: int = 0) -> MemoryPlan:
    """The memory plan a start makes from [server]'s memory_reserve_mb and memory_budget_mb
    (`kept_bytes`: what a reload keeps), from free memory now: the one computation of the
    budget, made by the daemon and by `stgcnd doctor --config` alike."""
    from stgcnd.runtimes.free_memory import device_memory, reserve_mb
    from stgcnd.server.memory_plan import PAID_FIXED, MemoryPlan

    reserve = reserve_mb(server.memory_reserve_mb, Target.this_machine().jetson)
    budget = server.memory_budget_mb
    if budget:
        if kept_bytes:  # what the kept models' runtimes paid once in this process, too
            kept_bytes += sum(PAID_FIXED.values())
        budget = max(budget - kept_bytes // 2**20, 1)
    # Free memory the one way (stgcnd/runtimes/free_memory.py: MemAvailable on a Jetson).
    return MemoryPlan.for_device(budget, reserve, device_memory, taken)


def camera_rate_at_risk(mc: ModelConfig, compute_ms: dict[int, float]) -> dict[str, object]:
    """The numbers, when one window's compute takes longer than a camera's `stride` frames at
    FRAMES_PER_S: that camera asks for predictions faster than they come, and its pushes
    (or windows) wait. Empty when it keeps up."""
    one = compute_ms.get(1)
    budget_ms = mc.stride * 1e3 / FRAMES_PER_S
    if not one or one <= budget_ms:
        return {}
    return {"compute_ms": round(one, 1), "stride": mc.stride, "frames_per_s": FRAMES_PER_S,
            "budget_ms": round(budget_ms, 1),
            "hint": f"each camera asks for a prediction every {budget_ms:.0f} ms (stride "
                    f"{mc.stride} at {FRAMES_PER_S} fps) and one takes {one:.0f} ms here: set "
                    f"stride to at least {math.ceil(one * FRAMES_PER_S / 1e3)}, or use a "
                    "faster runtime or precision"}


def _first_that_serves(mc: ModelConfig, store: EngineStore, generation: int,
                       start: Callable[[ServedModel], None] | None,
                       planner: Planner, background: bool = False,
                       keeps: ServedModel | None = None,
                       deferred: dict[str, Pending | None] | None = None) -> ServedModel:
    """`keeps` (a reload, with `deferred`): the model's current version, returned as it is
    while the new configuration's artefact builds, where its runners serve the same model."""
    # The same plan `stgcnd build --config` prepares the store with (server/serving_plan.py).
    spec, options = serving_plan(mc)
    if keeps is not None and serving_plan(keeps.config)[0] != spec:
        keeps = None  # another model (checkpoint, shape): its runners cannot stand in

    def use(choice: Choice) -> ServedModel:
        now = serve_now_instead(choice, spec, store, mc.backend == "auto") if background \
            else None
        if keeps is not None and deferred is not None and \
                current_runners_serve_on(choice, now, spec, store):
            deferred[mc.name] = Pending(choice, spec, engine=mc.engine)
            return keeps
        served = _serve_with(mc, now or choice, spec, store, generation, start, planner)
        if now is not None:
            served.building = Pending(choice, spec)
        return served
    try:
        return first_that_serves(spec, mc.backend, options, store, use)[0]
    except (BuildCancelled, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise _failed(mc, exc) from None


def _serve_with(mc: ModelConfig, choice: Choice, spec: ModelSpec, store: EngineStore,
                generation: int, start: Callable[[ServedModel], None] | None,
                planner: Planner) -> ServedModel:
    runtime, loaded_bytes = _load_runtime(mc, choice, spec, store, planner)
    return _place_and_start(mc, choice, runtime, loaded_bytes, generation, start, planner)


def _load_runtime(mc: ModelConfig, choice: Choice, spec: ModelSpec, store: EngineStore,
                  planner: Planner) -> tuple[Runtime, int]:
    """`choice`'s artefact built or found, and loaded: the runtime, and the device bytes
    loading it took (0 on a host runtime)."""
    plan = planner.for_gpu() if choice.options.device == "cuda" else None
    free_before = [0]
    if plan is not None:
        plan.check_before_build(mc.name, choice.backend, spec, choice.options.precision,
                                mc.instances)

        def artefact_ready() -> None:
            # Measured once the artefact exists: a first start's build (a child process whose
            # libraries fill the page cache) is not the model's cost.
            free_before[0] = plan.free_now()
    runtime = choice.load(spec, store, noop_compute_us=mc.noop_compute_us,
                          before_load=artefact_ready if plan is not None else None)
    try:  # before any runner: a label per class the artefact itself has, on every runtime
        artefact = " ".join(filter(None, (runtime.info.name, "artefact",
                                          runtime.info.artifact)))
        check_labels(mc.labels, runtime.artefact_classes,
                     f"{mc.checkpoint or 'the demo model'} (its {artefact})")
    except BaseException:
        runtime.close()
        raise
    return runtime, max(free_before[0] - plan.free_now(), 0) if plan is not None else 0


def _buckets(choice: Choice, runtime: Runtime) -> list[int]:
    """The options' buckets (serving_plan: the one source), cut by what the artefact takes."""
    max_batch = min(choice.options.max_batch, int(runtime.info.max_batch))
    return [b for b in choice.options.buckets if b <= max_batch]


def _place_and_start(mc: ModelConfig, choice: Choice, runtime: Runtime, loaded_bytes: int,
                     generation: int, start: Callable[[ServedModel], None] | None,
                     planner: Planner) -> ServedModel:
    """The loaded `runtime`'s buckets placed in the memory plan, and its runners made and
    warmed (`start`); the runtime is closed if that fails."""
    plan = planner.for_gpu() if choice.options.device == "cuda" else None
    buckets = _buckets(choice, runtime)
    planned = 0
    if plan is not None:
        try:
            buckets = plan.fit(mc.name, runtime, buckets, mc.instances, loaded_bytes)
        except BaseException:
            runtime.close()
            raise
        planned = plan.placed[-1].total
    served = ServedModel(mc, runtime, labels_for(mc, runtime), demo=mc.checkpoint is None,
                         generation=generation, why=choice.why, buckets=tuple(buckets),
                         planned_bytes=planned, max_batch=max(buckets), made_for=mc.engine,
                         loaded_bytes=loaded_bytes)
    if start is not None:
        try:
            runners_from = plan.free_now() if plan is not None else 0
            start(served)  # its runners: contexts, buffers, graphs, warm-up
            if plan is not None:
                _hold_the_budget(plan, served, runners_from, start)
        except BaseException:
            served.close()
            if plan is not None and plan.placed and plan.placed[-1].model == mc.name:
                plan.placed.pop()  # its memory went back with it
            raise
    return served


@dataclass
class Unplaced:
    """An upgrade's runtime, loaded, whose runners fit in the plan only where the serving
    runners are now: server/upgrade.py makes them after those are gone (the pause)."""

    choice: Choice
    runtime: Runtime
    loaded_bytes: int
    beside: list[int]   # the buckets that would fit beside the serving runners
    alone: list[int]    # those that fit in their place

    def close(self) -> None:
        self.runtime.close()


def load_upgrade(config: Config, served: ServedModel, start: Callable[[ServedModel], None],
                 cancel: threading.Event, current: dict[str, ServedModel], own: OwnGrowth
                 ) -> ServedModel | Unplaced:
    """`served`'s pending upgrade, off the loop: its artefact built (in the build child, at
    idle priority) and validated, then loaded and its runners made and warmed, beside the
    serving ones (`current`'s memory is kept in the plan: memory_plan.py refuses what does
    not fit beside it, the build first: a failed upgrade, tried again later). Where fewer
    of its buckets fit beside the serving runners than in their place, it is returned
    `Unplaced`: its runners are made after the serving ones go (`place_upgrade`). What is
    made in this process is made `own.during()` (the loop's memory policy: heap.py)."""
    pending = served.building
    assert pending is not None
    store = EngineStore(config.engines_dir, cancel=cancel,
                        retry=BuildRetry(config.server.build_retry_after_s,
                                         config.server.build_attempts))
    choice = pending.choice
    if choice.options.device == "cuda":  # the build beside what serves, before minutes of it
        Planner(config, current).for_gpu().check_build_beside(
            served.name, choice.backend, pending.spec, choice.options.precision,
            served.config.instances, choice.options.workspace_mb)
    at_idle_priority(lambda: store.prepare(pending.spec, choice.backend, choice.options))
    with own.during():
        planner = Planner(config, current)
        runtime, loaded = _load_runtime(served.config, choice, pending.spec, store, planner)
        if planner.plan is not None and served.planned_bytes > served.loaded_bytes:
            try:
                fits = functools.partial(planner.plan.buckets_that_fit, runtime,
                                         _buckets(choice, runtime), served.config.instances,
                                         loaded)
                beside, alone = fits(), fits(served.planned_bytes - served.loaded_bytes)
            except BaseException:
                runtime.close()
                raise
            if len(alone) > len(beside):
                return Unplaced(choice, runtime, loaded, beside, alone)
        fresh = _place_and_start(served.config, choice, runtime, loaded, served.generation,
                                 start, planner)
        planner.log()
        return fresh


def place_upgrade(config: Config, served: ServedModel, unplaced: Unplaced,
                  start: Callable[[ServedModel], None], current: dict[str, ServedModel]
                  ) -> ServedModel:
    """An `Unplaced` upgrade's runners made and warmed, off the loop, once `served`'s own
    are gone (its `planned_bytes` then its runtime's only)."""
    planner = Planner(config, current, taken=unplaced.loaded_bytes)  # loaded, charged again
    fresh = _place_and_start(served.config, unplaced.choice, unplaced.runtime,
                             unplaced.loaded_bytes, served.generation, start, planner)
    planner.log()
    return fresh


def _hold_the_budget(plan: MemoryPlan, served: ServedModel, runners_from: int,
                     start: Callable[[ServedModel], None]) -> None:
    """Runners that took more than planned and no longer fit are made again with the
    buckets that fit at the fitted cost (memory_plan.py: a runtime's fixed part is paid
    once, not per bucket; the estimate is a model, this is the device)."""
    took = max(runners_from - plan.free_now(), 0)
    placed = plan.placed[-1]
    plan.measured(took)
    if plan.left >= 0:
        return
    log.warning("memory_plan_corrected", model=served.name, runtime=placed.runtime,
                planned_mb=round(placed.estimate * placed.instances / 2**20, 1),
                measured_mb=round(took / 2**20, 1),
                fixed_mb=round(plan.fixed.get(placed.runtime, 0) / 2**20, 1),
                buckets_before=list(served.buckets))
    _remake(plan, served, start, lambda: plan.refit(
        served.name, served.runtime, served.buckets, served.config.instances,
        placed.loaded_bytes, took))
    # Closing runners need not give all their memory back (a caching allocator keeps blocks,
    # compiled kernels stay: docs/performance.md, "Device memory"). Counted, and the runners
    # made once more to fit, so that the process, not just the plan, holds the budget.
    held = plan.unaccounted()
    if held > 0 and plan.left < held:
        plan.held += held
        placed = plan.placed[-1]
        scale = placed.runner_bytes / max(placed.estimate, 1)
        log.warning("memory_plan_corrected", model=served.name, runtime=placed.runtime,
                    held_mb=round(held / 2**20, 1), buckets_before=list(served.buckets),
                    reason="the runners made before still hold memory")
        _remake(plan, served, start, lambda: plan.fit(
            served.name, served.runtime, served.buckets, served.config.instances,
            placed.loaded_bytes, scale=scale))
        # What is still held after this remake (most of it may have come back).
        plan.held = max(plan.held + plan.unaccounted(), 0)


def _remake(plan: MemoryPlan, served: ServedModel, start: Callable[[ServedModel], None],
            refit: Callable[[], list[int]]) -> None:
    """Close `served`'s runners and make them again with the buckets `refit` keeps."""
    for ex in served.executors:
        ex.close()
    served.executors.clear()
    plan.placed.pop()  # (closing the runners gave their graphs' pools back)
    buckets = refit()
    served.buckets, served.max_batch = tuple(buckets), max(buckets)
    runners_from = plan.free_now()
    start(served)
    plan.measured(max(runners_from - plan.free_now(), 0))


def _failed(mc: ModelConfig, exc: BaseException) -> UserError:
    """One line for a model that no runtime serves: the error's own message when it is the
    user's to fix (a named backend's, or the auto chain's list), else the step and the error."""
    if isinstance(exc, UserError):
        exc.args = (f"model {mc.name!r}: {exc}",)
        return exc
    return UserError(f"model {mc.name!r}: the {mc.backend} runtime failed at "
                     f"{step_of(exc)}: {type(exc).__name__}: {str(exc).strip()[:300]}")
