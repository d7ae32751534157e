"""Serve at once, upgrade in place (#45): a model whose configured artefact is not in the store
yet is served by the quickest runtime that can serve now, READY is sent, and the artefact is
built in the background (the build child, at the lowest CPU priority); once it is built and
validated, its runners are made and warmed beside the serving ones and swapped in on the I/O
loop, the queue and everything the requests and events hold on the model kept.

The pieces: `serve_now_instead` picks what serves meanwhile (the one hook of the load,
server/models.py), `Upgrades` is the loop's duty that starts the background work and swaps
(server/server.py), `swap` is the swap itself, and `at_idle_priority` runs the build so that
it only takes the CPU the serving runtime leaves. A failed upgrade leaves the current runners
serving and is tried again after `build_retry_after_s`, at most `build_attempts` times (the
store's failure record decides whether a retry builds: engines/retry.py).

Where the memory plan fits more of the new runners' buckets in the serving runners' place
than beside them (a board whose engine grows: models.Unplaced), the serving runners go
first: the pause. They finish the batch in flight and close, the model's requests wait in
its queue (those past its queue_size are refused busy, as under load), the new runners are
made and warmed, and they take the queue. Should they fail, the old runtime's runners are
made again (it stays loaded through the pause: weights, not activations) and the upgrade is
retried as any failed one; should those fail too, nothing can serve the model and the daemon
stops (exit 1: systemd starts it again). One pause at a time, never beside a reload.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union, cast

from stgcnd.errors import BuildCancelled, first_line
from stgcnd.log import get_logger
from stgcnd.server.models import ServedModel, Unplaced, in_thread
from stgcnd.server.scheduler import Scheduler
from stgcnd.server.serve_now import Pending

log = get_logger(__name__)

CHECK_EVERY_S = 1.0   # the loop's duty: how soon a finished upgrade is swapped in
PAUSED_CHECK_S = 0.01  # ... and during a pause, when the model's requests wait on it
CLOSE_WAIT_S = 10.0   # shutdown: how long an upgrade still warming its runners is waited for

if TYPE_CHECKING:  # (Future is not subscriptable at run time on Python 3.8)
    Made = Future[Union[ServedModel, Unplaced]]


def compute_by_bucket(model: ServedModel) -> dict[str, float]:
    first = model.executors[0] if model.executors else None
    return {str(b): round(v, 3) for b, v in sorted(first.compute_ms.items())} if first else {}


def swap(model: ServedModel, fresh: ServedModel) -> ServedModel:
    """Serve `model` with `fresh`'s runtime and warmed runners; returns what it served with
    before, as a model of its own to retire (its executors finish the batch in flight, then
    close). Called on the I/O loop, between its passes: no batch is taken meanwhile, the
    queue (the scheduler, with every job waiting) stays the model's and the new runners take
    from it; the model object stays, so requests, cameras' rings and events see no change."""
    retired = _detached(model, runtime_kept=False)
    for ex in fresh.executors:
        ex.scheduler = model.scheduler
        ex.labels = model.labels
    model.runtime, model.executors = fresh.runtime, fresh.executors
    model.why, model.buckets = fresh.why, fresh.buckets
    model.planned_bytes, model.max_batch = fresh.planned_bytes, fresh.max_batch
    model.made_for, model.building = fresh.made_for, None
    model.loaded_bytes = fresh.loaded_bytes
    return retired


def vacate(model: ServedModel) -> ServedModel:
    """The pause's first step: `model`'s runners taken off its queue, returned as a model of
    their own to retire (its runtime stays `model`'s); the queue waits for `swap`."""
    retired = _detached(model, runtime_kept=True)
    model.executors = []
    model.planned_bytes = model.loaded_bytes  # what the plan of the new runners counts
    return retired


def _detached(model: ServedModel, runtime_kept: bool) -> ServedModel:
    retired = dataclasses.replace(model, executors=list(model.executors), building=None,
                                  runtime_kept=runtime_kept)
    # Nothing left to take: an old executor finishes its batch in flight, finds its queue
    # closed and empty, and closes (Executor.drive); its replies leave as any other's.
    retired.scheduler = Scheduler(1)
    retired.scheduler.close()
    for ex in retired.executors:
        ex.scheduler = retired.scheduler
    return retired


@dataclass
class Hooks:
    """What the loop (server/server.py) lends the upgrades. Off the loop: `build` (a pending
    upgrade made and warmed, or Unplaced), `place` (an Unplaced one's runners made) and
    `remake` (the model's own runtime's runners made again, as a model to swap in). On it:
    `models` (served now), `retire` (runners to drain and close), `fail` (stop the daemon,
    exit 1), `reloading`, and [server] `retry_after_s` and `attempts`."""

    models: Callable[[], dict[str, ServedModel]]
    build: Callable[[ServedModel], ServedModel | Unplaced]
    place: Callable[[ServedModel, Unplaced], ServedModel]
    remake: Callable[[ServedModel], ServedModel]
    retire: Callable[[ServedModel], None]
    fail: Callable[[BaseException], None]
    reloading: Callable[[], bool]
    retry_after_s: Callable[[], float]
    attempts: Callable[[], int]


@dataclass
class _Pause:
    model: ServedModel
    pending: Pending
    unplaced: Unplaced
    retired: ServedModel          # its runners, draining; as the model was before the pause
    since: float
    making: Future[ServedModel] | None = None
    restoring: bool = False       # `making` is the old runtime's runners again


class Upgrades:
    """The loop's duty (server/duties.py): start each served model's pending upgrade when due,
    and swap in those done, pausing the model where they fit only in its runners' place."""

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        # Started and not yet finished, by the model they were started for: kept here, not
        # only on the model, so that one whose model a reload replaced meanwhile is still
        # finished (what it made closed) and one made when shutdown comes is closed.
        self._started: list[tuple[ServedModel, Pending, Made]] = []
        self._pause: _Pause | None = None

    @property
    def pausing(self) -> bool:
        """A model's runners are being replaced in place: its requests wait (no reload)."""
        return self._pause is not None

    def every(self) -> float:
        return PAUSED_CHECK_S if self._pause is not None else CHECK_EVERY_S

    def check(self, now: float) -> None:
        if self._pause is not None:
            self._go_on_pausing(now)
        for entry in list(self._started):
            model, pending, future = entry
            if self._may_finish(future):
                self._started = [e for e in self._started if e is not entry]  # by identity
                pending.started = False
                self._finish(model, pending, future, now)
        for model in list(self._hooks.models().values()):
            due = model.building
            if due is not None and not due.started and now >= due.due:
                due.started = True
                self._started.append((model, due, in_thread(
                    f"upgrade-{model.name}", functools.partial(self._hooks.build, model))))
                log.info("upgrade_started", model=model.name, **due.describe())

    def _may_finish(self, future: Made) -> bool:
        """Done, and where its runners are to be made in the serving ones' place, a pause
        may begin: none is under way and no reload runs."""
        if not future.done():
            return False
        if future.exception() is not None or not isinstance(future.result(), Unplaced):
            return True
        return self._pause is None and not self._hooks.reloading()

    def close(self, timeout_s: float) -> None:
        """At shutdown (the stop cancels a build running): close what the upgrades started
        made and never swapped in, waiting up to `timeout_s` for those still warming. A
        pause's model has no runners then: the shutdown answered its queue."""
        started, self._started = self._started, []
        futures: dict[Made, ServedModel] = {future: model for model, _, future in started}
        pause, self._pause = self._pause, None
        if pause is not None and pause.making is None:
            pause.unplaced.close()  # loaded, never placed
        elif pause is not None:  # (a Future[ServedModel] is a Made: one type for `wait`)
            futures[cast("Made", pause.making)] = pause.model
        done, not_done = wait(futures, timeout=timeout_s)
        for future in done:
            if future.exception() is not None:  # a failed or cancelled one made nothing
                continue
            made = future.result()
            if pause is not None and pause.restoring and future is pause.making and \
                    isinstance(made, ServedModel):
                for ex in made.executors:  # its runtime is the model's: closed with it
                    ex.close()
            else:
                made.close()
        for future in not_done:
            log.warning("upgrade_not_closed", model=futures[future].name,
                        reason=f"its runners were still being made after {timeout_s:g} s; "
                               "the process exits without closing them")

    def _finish(self, model: ServedModel, pending: Pending, future: Made, now: float) -> None:
        replaced = self._hooks.models().get(model.name) is not model or \
            model.building is not pending
        try:
            fresh = future.result()
        except BuildCancelled:
            return  # stopping: nothing to retry
        except Exception as exc:
            if not replaced:  # else a reload replaced the model: its own configuration builds
                self._failed(model, pending, exc, now)
            return
        if replaced:
            fresh.close()  # a reload replaced the model meanwhile
        elif isinstance(fresh, Unplaced):
            self._begin_pause(model, pending, fresh)
        else:
            before = _described(model)
            self._hooks.retire(swap(model, fresh))
            log.info("model_upgraded", model=model.name, before=before,
                     after=_described(model), attempts=pending.attempts + 1)

    def _failed(self, model: ServedModel, pending: Pending, exc: BaseException,
                now: float) -> None:
        retry_s = self._hooks.retry_after_s()
        pending.attempts += 1
        give_up = pending.attempts >= self._hooks.attempts()
        pending.due = now + retry_s
        log.warning("upgrade_failed", model=model.name, error=f"{type(exc).__name__}: "
                    f"{first_line(str(exc))[:300]}", serving=model.runtime.info.precision,
                    attempts=pending.attempts,
                    action="still serving the current runners; " + (
                        "not tried again (build_attempts): `stgcnd build --rebuild` "
                        "and a restart or reload build it" if give_up else
                        f"tried again in {retry_s:g} s (build_retry_after_s)"))
        if give_up:
            model.building = None

    def _begin_pause(self, model: ServedModel, pending: Pending, unplaced: Unplaced) -> None:
        pending.started = True  # no second build while this one is placed
        retired = vacate(model)
        self._pause = _Pause(model, pending, unplaced, retired, since=time.monotonic())
        self._hooks.retire(retired)
        log.info("upgrade_paused", model=model.name, queued=model.scheduler.pending,
                 buckets_beside=unplaced.beside, buckets_in_place=unplaced.alone,
                 reason="the new runners fit more buckets in the serving runners' place "
                        "than beside them: those go first, requests wait in the queue")

    def _go_on_pausing(self, now: float) -> None:
        """The pause's next step: once the old runners are closed, the new ones made; once
        made, swapped in; if they fail, the old runtime's made again."""
        p = self._pause
        assert p is not None
        if p.making is None:
            if p.retired.drained:  # their memory is back: the new runners' turn
                p.making = in_thread(f"upgrade-{p.model.name}", functools.partial(
                    self._hooks.place, p.model, p.unplaced))
            return
        if not p.making.done():
            return
        paused_ms = round((time.monotonic() - p.since) * 1e3, 1)
        try:
            made = p.making.result()
        except Exception as exc:
            if p.restoring:  # nothing can serve the model now
                self._pause = None
                log.error("upgrade_restore_failed", model=p.model.name, error=repr(exc),
                          action="the daemon stops (exit 1) and starts again")
                self._hooks.fail(exc)
                return
            self._failed(p.model, p.pending, exc, now)
            p.restoring = True
            p.making = in_thread(f"upgrade-{p.model.name}", functools.partial(
                self._hooks.remake, p.model))
            return
        self._pause, p.pending.started = None, False
        if p.restoring:  # the old runtime's runners again: nothing to retire
            building = p.model.building  # the upgrade, retried (unless given up)
            swap(p.model, made)
            p.model.planned_bytes, p.model.building = p.retired.planned_bytes, building
            log.info("upgrade_pause_ended", model=p.model.name, paused_ms=paused_ms,
                     serving=_described(p.model))
            return
        self._hooks.retire(swap(p.model, made))  # the old runtime, closed when reaped
        log.info("model_upgraded", model=p.model.name, before=_described(p.retired),
                 after=_described(p.model), attempts=p.pending.attempts + 1,
                 paused_ms=paused_ms)


def _described(model: ServedModel) -> dict[str, object]:
    info = model.runtime.info
    return {"backend": info.name, "precision": info.precision,
            "compute_ms": compute_by_bucket(model)}


def describe_building(model: ServedModel) -> dict[str, object] | None:
    return model.building.describe() if model.building is not None else None
