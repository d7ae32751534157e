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
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from concurrent.futures import Future, wait

from stgcnd.errors import BuildCancelled, first_line
from stgcnd.log import get_logger
from stgcnd.server.models import ServedModel, in_thread
from stgcnd.server.scheduler import Scheduler
from stgcnd.server.serve_now import Pending

log = get_logger(__name__)

CHECK_EVERY_S = 1.0   # the loop's duty: how soon a finished upgrade is swapped in
CLOSE_WAIT_S = 10.0   # shutdown: how long an upgrade still warming its runners is waited for


def compute_by_bucket(model: ServedModel) -> dict[str, float]:
    first = model.executors[0] if model.executors else None
    return {str(b): round(v, 3) for b, v in sorted(first.compute_ms.items())} if first else {}


def swap(model: ServedModel, fresh: ServedModel) -> ServedModel:
    """Serve `model` with `fresh`'s runtime and warmed runners; returns what it served with
    before, as a model of its own to retire (its executors finish the batch in flight, then
    close). Called on the I/O loop, between its passes: no batch is taken meanwhile, the
    queue (the scheduler, with every job waiting) stays the model's and the new runners take
    from it; the model object stays, so requests, cameras' rings and events see no change."""
    retired = dataclasses.replace(model, executors=list(model.executors), building=None)
    # Nothing left to take: an old executor finishes its batch in flight, finds its queue
    # closed and empty, and closes (Executor.drive); its replies leave as any other's.
    retired.scheduler = Scheduler(1)
    retired.scheduler.close()
    for ex in retired.executors:
        ex.scheduler = retired.scheduler
    for ex in fresh.executors:
        ex.scheduler = model.scheduler
        ex.labels = model.labels
    model.runtime, model.executors = fresh.runtime, fresh.executors
    model.why, model.buckets = fresh.why, fresh.buckets
    model.planned_bytes, model.max_batch = fresh.planned_bytes, fresh.max_batch
    model.made_for, model.building = fresh.made_for, None
    return retired


class Upgrades:
    """The loop's duty (server/duties.py): start each served model's pending upgrade when due,
    and swap in those done. `models()`: the models served now; `build(model)`: its upgrade
    made and warmed, off the loop; `retire(model)`: an old set of runners to drain and close;
    `retry_after_s()` and `attempts()`: [server] build_retry_after_s and build_attempts."""

    def __init__(self, models: Callable[[], dict[str, ServedModel]],
                 build: Callable[[ServedModel], ServedModel],
                 retire: Callable[[ServedModel], None],
                 retry_after_s: Callable[[], float], attempts: Callable[[], int]) -> None:
        self._models, self._build, self._retire = models, build, retire
        self._retry_after_s, self._attempts = retry_after_s, attempts
        # Started and not yet finished, by the model they were started for: kept here, not
        # only on the model, so that one whose model a reload replaced meanwhile is still
        # finished (what it made closed) and one made when shutdown comes is closed.
        self._started: list[tuple[ServedModel, Pending, Future[ServedModel]]] = []

    def check(self, now: float) -> None:
        for entry in list(self._started):
            model, pending, future = entry
            if future.done():
                self._started = [e for e in self._started if e is not entry]  # by identity
                pending.started = False
                self._finish(model, pending, future, now)
        for model in list(self._models().values()):
            due = model.building
            if due is not None and not due.started and now >= due.due:
                due.started = True
                self._started.append((model, due, in_thread(
                    f"upgrade-{model.name}", functools.partial(self._build, model))))
                log.info("upgrade_started", model=model.name, **due.describe())

    def close(self, timeout_s: float) -> None:
        """At shutdown (the stop cancels a build running): close what the upgrades started
        made and never swapped in, waiting up to `timeout_s` for those still warming."""
        started, self._started = self._started, []
        futures = {future: model for model, _, future in started}
        done, not_done = wait(futures, timeout=timeout_s)
        for future in done:
            if future.exception() is None:  # a failed or cancelled one made nothing to keep
                future.result().close()
        for future in not_done:
            log.warning("upgrade_not_closed", model=futures[future].name,
                        reason=f"its runners were still being made after {timeout_s:g} s; "
                               "the process exits without closing them")

    def _finish(self, model: ServedModel, pending: Pending, future: Future[ServedModel],
                now: float) -> None:
        replaced = self._models().get(model.name) is not model or model.building is not pending
        try:
            fresh = future.result()
        except BuildCancelled:
            return  # stopping: nothing to retry
        except Exception as exc:
            if replaced:  # a reload replaced the model: its own configuration builds now
                return
            pending.attempts += 1
            give_up = pending.attempts >= self._attempts()
            pending.due = now + self._retry_after_s()
            log.warning("upgrade_failed", model=model.name, error=f"{type(exc).__name__}: "
                        f"{first_line(str(exc))[:300]}", serving=model.runtime.info.precision,
                        attempts=pending.attempts,
                        action="still serving the current runners; " + (
                            "not tried again (build_attempts): `stgcnd build --rebuild` "
                            "and a restart or reload build it" if give_up else
                            f"tried again in {self._retry_after_s():g} s "
                            "(build_retry_after_s)"))
            if give_up:
                model.building = None
            return
        if replaced:
            fresh.close()  # a reload replaced the model meanwhile
            return
        before, before_ms = model.runtime.info, compute_by_bucket(model)
        self._retire(swap(model, fresh))
        after = model.runtime.info
        log.info("model_upgraded", model=model.name,
                 before={"backend": before.name, "precision": before.precision,
                         "compute_ms": before_ms},
                 after={"backend": after.name, "precision": after.precision,
                        "compute_ms": compute_by_bucket(model)},
                 attempts=pending.attempts + 1)


def describe_building(model: ServedModel) -> dict[str, object] | None:
    return model.building.describe() if model.building is not None else None
