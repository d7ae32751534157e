"""The daemon's life: made complete (models warmed, sockets bound), then the I/O loop, then a
bounded graceful shutdown. The loop's one thread owns the sockets, the cameras and every
executor, and sends every reply."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple, TypeVar

import msgspec
import zmq
from zmq.backend import zmq_poll

from stgcnd import __version__, cpupower
from stgcnd.log import configure_logging, debug_enabled, get_logger, logging_config
from stgcnd.server import beside_loop
from stgcnd.server.cameras import CameraTable
from stgcnd.server.config import LOOP_TICK_MS, RESTART, SERVER_ENGINE, Config
from stgcnd.server.config_checks import check_config
from stgcnd.server.connections import Connections, connection_caps
from stgcnd.server.curve_policy import KeyHandler, curve_enabled
from stgcnd.server.duties import Duties, Duty
from stgcnd.server.errorlog import ClientErrorLog
from stgcnd.server.event_hub import EventHub
from stgcnd.server.executor import shutting_down
from stgcnd.server.handshakes import Refusals, monitor_reporter
from stgcnd.server.heap import CHECK_EVERY_S, OwnGrowth, RssWatch, give_back_free_memory
from stgcnd.server.memory_policy import MemoryPolicy
from stgcnd.server.models import (
    ServedModel,
    Unplaced,
    in_thread,
    load_models,
    load_upgrade,
    place_upgrade,
)
from stgcnd.server.notify import Notifier
from stgcnd.server.requests import RequestPath
from stgcnd.server.serve_now import Pending
from stgcnd.server.transport import POLLIN, bind_router, make_router
from stgcnd.server.upgrade import CLOSE_WAIT_S as UPGRADE_CLOSE_WAIT_S
from stgcnd.server.upgrade import Hooks, Upgrades, describe_building
from stgcnd.server.wakeup import WakeTimer, Wakeup
from stgcnd.telemetry.sampler import SystemSampler
from stgcnd_client.protocol import Limits

log = get_logger(__name__)

RETIRE_TIMEOUT_S = 30.0   # a reloaded-away model's executors drain within this
SHUTDOWN_QUIET_S = 0.1    # shutdown: the socket closes after this long without a request...
SHUTDOWN_REFUSE_S = 1.0   # ...or after refusing for this long, whichever comes first
CLOSE_LINGER_MS = 1000    # the last replies get this long to leave at close
GROWTH_READ_PASSES = 4    # heap growth: read up to 4 bursts of waiting requests first

T = TypeVar("T")


class Reloaded(NamedTuple):
    """What a reload made off the loop: the configuration to apply, and its models (the kept
    ones among them), every runner warmed."""

    config: Config
    models: dict[str, ServedModel]
    # Kept models whose new engine keys build in the background while their runners serve:
    # what each is upgraded to (models.load_models), set as its `building` when applied.
    deferred: dict[str, Pending | None]


def start_curve(ctx: zmq.Context[zmq.Socket[bytes]], config: Config) -> KeyHandler | None:
    """The key handler where CURVE is on; its module (a thread and key files) loads only then."""
    if not curve_enabled(config):
        return None
    from stgcnd.server.curve import Curve
    return Curve(ctx, config)


class Server:
    """The daemon, complete once made: its models loaded and warmed, its sockets bound.
    `serve` runs the loop until a signal, then shuts down (uvicorn's Server.run)."""

    def __init__(self, config: Config, wakeup: Wakeup, notifier: Notifier,
                 reread: Callable[[], Config], follow_log_level: bool = True) -> None:
        """`wakeup`: its signal handlers installed (a stop abandons a first-start build:
        BuildCancelled, nothing partial kept). `reread`: the configuration as a reload reads
        it. `follow_log_level`: a reload applies [server] log_level (no --log-level)."""
        self.config = config
        self.wakeup = wakeup
        self.notifier = notifier
        self._reread = reread
        self._follow_log_level = follow_log_level
        self.generation = 1
        self.started = time.monotonic()
        self.retiring: list[ServedModel] = []
        self._own_growth = OwnGrowth()  # upgrades' runners being made (the memory check)
        # Background builds started, and swapped in once built and warmed (server/upgrade.py).
        self._upgrades = Upgrades(Hooks(
            models=lambda: self.models, build=self._load_upgrade, place=self._place_upgrade,
            remake=self._remake_runners, retire=self.retiring.append, fail=wakeup.fail,
            reloading=lambda: self._reload is not None,
            retry_after_s=lambda: self.config.server.build_retry_after_s,
            attempts=lambda: self.config.server.build_attempts))
        self._reload: Future[Reloaded] | None = None  # done: it wakes the loop
        self._timer = WakeTimer()  # polled runners' next look (poll wakes on it)
        self._last_stats = time.monotonic()  # the latency lines' interval ends here
        self._stall_logged = False  # watchdog_stall said for the stall going on (_watchdog)
        self._faults = ClientErrorLog()  # the loop's duties' failures (_guard)
        self.models = self._load_first(config)
        s = config.server
        self._ctx = zmq.Context()
        # CURVE before the binds: no connection without a key (server/curve.py).
        self.curve = start_curve(self._ctx, config)
        requests_cap, events_cap = connection_caps(s.max_connections, bool(s.events_endpoint))
        # Refused handshakes: the client never hears why, so the log says it
        # (server/handshakes.py); with CURVE, as curve_denied with the ZAP handler's.
        refusals = self.curve.refusals if self.curve is not None else \
            Refusals("handshake_failed", "failed")
        report_handshakes = monitor_reporter(refusals, curve=self.curve is not None)
        self.events = EventHub(self._ctx, config, self.curve, events_cap)
        if self.events.connections is not None:
            self.events.connections.on_handshake_failed = report_handshakes
        self.events.configure(self.models, self.config.server)
        self._router = make_router(self._ctx, config)
        if self.curve is not None:
            self.curve.secure(self._router)
        # Counted before the bind: no connection is accepted unseen (server/connections.py).
        self.connections = Connections(self._ctx, self._router, requests_cap)
        self.connections.on_handshake_failed = report_handshakes
        self._rss = RssWatch(s.max_rss_mb)  # what a peer can make libzmq hold (heap.py)
        log.info("memory_limit", rss_mb=round(self._rss.rss() / 2**20, 1),
                 limit_mb=round(self._rss.limit / 2**20, 1),
                 action="over it, connections that send nothing are closed")
        self._ipc_path = bind_router(self._router, config)
        self.connections.gate_listeners()
        self.cameras = CameraTable(s.max_cameras)
        self.requests = RequestPath(
            self._router, self.connections, self.cameras,
            Limits(max_message_bytes=s.max_message_bytes), self.stats, self.events)
        self.requests.models = self.models
        self._memory = MemoryPolicy(self._rss, self._all_connections, self._read_waiting,
                                    lambda: self.requests.discarding, self.requests.errors)
        if self.curve is not None:
            self.requests.use_curve(self.curve)
        self._sampler = SystemSampler(s.stats_interval,
                                      lambda fields: log.info("system", **fields),
                                      tegrastats_path=s.tegrastats) if s.system_stats else None
        if self._sampler is not None:
            self._sampler.start()
        names = ", ".join(f"{m.name} ({m.runtime.info.name}/{m.runtime.info.precision})"
                          for m in self.models.values())
        notifier.ready(f"serving {names} on {config.endpoint}")
        # Without a timerfd the loop comes back for a batch in whole milliseconds (see
        # server/wakeup.py), and deep idle states and low clocks slow every request that
        # follows an idle gap (stgcnd/cpupower.py): both worth a line where latency is read.
        log.info("ready", endpoint=config.endpoint,
                 models={n: {"runtime": m.runtime.info.name, "precision":
                             m.runtime.info.precision, "device": m.runtime.info.device,
                             "motion": m.config.motion, "why": m.why,
                             "building": describe_building(m)}
                         for n, m in self.models.items()},
                 version=__version__, pid=os.getpid(),
                 loop_timer="timerfd" if self._timer.fd is not None else "poll-ms",
                 cpu_power=cpupower.summary(cpupower.cpu_power()))

    def _load_first(self, config: Config) -> dict[str, ServedModel]:
        """The first start's models, systemd kept waiting meanwhile (a first-run engine
        build takes minutes on a Jetson)."""
        keepalive = threading.Event()

        def extend() -> None:
            while not keepalive.wait(20.0):
                self.notifier.extend_timeout(60.0)

        self.notifier.extend_timeout(60.0)
        self.notifier.status("building or loading engines")
        threading.Thread(target=extend, name="extend-timeout", daemon=True).start()
        try:
            return load_models(config, self.generation,
                               start=lambda model: self._start_model(model, config),
                               cancel=self.wakeup.stop, background=True)
        finally:
            keepalive.set()

    def _start_model(self, model: ServedModel, config: Config) -> None:
        s = config.server
        lanes = s.max_cameras if model.config.client_streams else 0
        model.start(s.queue_size, lanes, s.warmup_runs, self.wakeup.wake, self.wakeup.fail)

    # -- the I/O loop ----------------------------------------------------------------------
    def serve(self) -> int:
        """poll -> each ready socket's handler -> the executors -> the duties due; until a
        signal, then shutdown."""
        beside_loop.loop_serves()  # the interpreter's switch interval
        router, requests, feed, wakeup = self._router, self.requests, self.events, self.wakeup
        receiver, monotonic = requests.receiver, time.monotonic
        handlers = self._socket_handlers()
        # zmq_poll on a list made once (zmq.Poller.poll is a Python call in front of it);
        # polled, and handled, in this order: requests last.
        polled = [(sock, POLLIN) for sock in (*handlers, router)]
        self._last_stats = monotonic()
        duties = Duties(self._duties(), self._guard, self._last_stats)
        timeout = LOOP_TICK_MS
        guard = self._guard
        # Every step below runs as _guard runs a duty (its try/except written out here, on
        # the path of every request): none can end the loop.
        while not wakeup.stop.is_set():
            reading = receiver.discarding  # the rest of an oversized message, dropped
            waiting = False  # a request is: the poll said so
            for sock, _ in zmq_poll(polled, timeout):
                if sock is router:
                    reading = waiting = True
                else:
                    handlers[sock]()
            if reading:
                try:
                    requests.read(waiting=waiting)
                except Exception as exc:
                    self._fault("requests", exc)
            now = monotonic()
            try:
                feed.beat(now)  # snapshots for new subscribers, the heartbeat
            except Exception as exc:
                self._fault("events_beat", exc)
            try:
                drove = self._drive(now)
            except Exception as exc:
                self._fault("drive", exc)
                drove = LOOP_TICK_MS
            timeout = 0 if receiver.discarding else drove
            if wakeup.reload.is_set() and not self._upgrades.pausing:  # after the pause
                wakeup.reload.clear()
                guard("reload", self._begin_reload)
            if self._reload is not None and self._reload.done():
                guard("reload", self._finish_reload, self._reload)
            if now >= duties.next_due:
                duties.run_due(now)
        return self.shutdown()

    def _socket_handlers(self) -> dict[Any, Callable[[], object]]:
        """What the loop does when each socket but the requests' is ready, by socket (or fd)."""
        guard, timer, wakeup = self._guard, self._timer, self.wakeup
        connections, feed = self.connections, self.events
        handlers: dict[Any, Callable[[], object]] = {}
        if timer.fd is not None:
            handlers[timer.fd] = timer.clear  # polled runners' next look: the executors below
        handlers[wakeup.read_fd] = wakeup.drain  # a signal or a worker: the flags are read below
        handlers[connections.monitor] = lambda: guard(
            "connections", connections.on_monitor, time.monotonic())
        subscribers, feed_conns = feed.socket, feed.connections
        if subscribers is not None and feed_conns is not None:
            handlers[feed_conns.monitor] = lambda: guard(
                "events_connections", feed_conns.on_monitor, time.monotonic())
            handlers[subscribers] = lambda: guard("subscriptions", feed.read, time.monotonic())
        return handlers

    def _duties(self) -> list[Duty]:
        """The periodic duties, in the order they run when due together."""
        feed, stats_s = self.events, self.config.server.stats_interval
        duties = [
            Duty("memory", self._check_memory, lambda: CHECK_EVERY_S),
            # A dead camera's events end in seconds, not minutes.
            Duty("events_sweep", lambda now: feed.expire_silent(now, self.cameras.cameras),
                 lambda: CHECK_EVERY_S),
            # Its report and its housekeeping apart: a bug in a report never stops idle
            # cameras going, nor the connections' budgets. A reload may change the interval.
            Duty("stats_tick", self._report, lambda: self.config.server.stats_interval,
                 first=stats_s),
            Duty("housekeeping", self._housekeep, lambda: self.config.server.stats_interval,
                 first=stats_s),
        ]
        duties.append(Duty("upgrades", self._upgrades.check, self._upgrades.every))
        wd_interval = self.notifier.watchdog_interval
        if wd_interval:
            duties.append(Duty("watchdog", self._watchdog, lambda: wd_interval))
        return duties

    def _load_upgrade(self, model: ServedModel) -> ServedModel | Unplaced:
        """A model's pending upgrade built, loaded and warmed (the upgrade's thread)."""
        config = self.config
        return load_upgrade(config, model, lambda m: self._start_model(m, config),
                            self.wakeup.stop, dict(self.models), self._own_growth)

    def _place_upgrade(self, model: ServedModel, unplaced: Unplaced) -> ServedModel:
        """An upgrade's runners made where `model`'s were (the pause's thread)."""
        config = self.config
        with self._own_growth.during():
            return place_upgrade(config, model, unplaced,
                                 lambda m: self._start_model(m, config), dict(self.models))

    def _remake_runners(self, model: ServedModel) -> ServedModel:
        """`model`'s runtime's runners made again, as a model to swap in (the pause's thread,
        when the upgrade's failed)."""
        again = dataclasses.replace(model, executors=[], building=None)
        with self._own_growth.during():
            self._start_model(again, self.config)
        return again

    def _guard(self, duty: str, work: Callable[..., T], *args: Any) -> T | None:
        """One of the loop's duties; None when it raised. A bug met in a duty (the silent-camera
        sweep, the stats tick, reading, ...) is logged at error (loop_duty_failed, once per
        duty and ERROR_LOG_WINDOW_S, the rest counted) and the loop goes on at its next pass:
        it never ends the daemon and with it every camera. A bug in one camera's request or
        prediction is contained closer, as that camera's (RequestPath.fault)."""
        try:
            return work(*args)
        except Exception as exc:
            self._fault(duty, exc)
            return None

    def _fault(self, duty: str, exc: Exception) -> None:
        """A duty's failure, said as _guard says it (called in its except block)."""
        self._faults.report(duty, event="loop_duty_failed", fault=True,
                            error=f"{type(exc).__name__}: {exc}",
                            traceback=traceback.format_exc(limit=8))

    def _drive(self, now: float) -> int:
        """Turn every executor (finish done batches, launch queued work), send their
        replies, arm the timer for the next look; the poll timeout to use (ms)."""
        requests = self.requests
        next_look: float | None = None
        for model in (*self.models.values(), *self.retiring):
            for ex in model.executors:
                if not ex.alive:  # an attribute: read every pass
                    continue
                try:
                    replies, look = ex.drive(now)
                except Exception as exc:  # the runner's own errors are answered inside
                    # A daemon or driver bug outside a batch (e.g. attaching the device):
                    # stop gracefully, exit 1, and let systemd restart us.
                    log.error("executor_failed", executor=ex.name,
                              error=f"{type(exc).__name__}: {exc}",
                              traceback=traceback.format_exc(limit=8))
                    self.wakeup.fail(exc)
                    ex.close_quietly()
                    queued = model.scheduler.drain() if not any(
                        e.alive for e in model.executors) else []
                    replies, look = ex.abandon(exc, queued), None
                for reply in replies:
                    requests.complete(reply, now)
                if look is not None and (next_look is None or look < next_look):
                    next_look = look
        timer = self._timer
        if next_look is None:
            if timer.armed_at is not None:  # the common case, idle between requests: no call
                timer.disarm()
            return LOOP_TICK_MS
        if timer.fd is not None:
            timer.arm(next_look)
            return LOOP_TICK_MS
        # No timerfd (not Linux): whole milliseconds, rounded up, at least one.
        return min(max(math.ceil((next_look - time.monotonic()) * 1e3), 1), LOOP_TICK_MS)

    def _tick(self, now: float) -> None:
        """The stats tick at shutdown: the duties' two rows of it (_duties), as they run."""
        self._guard("stats_tick", self._report, now)
        self._guard("housekeeping", self._housekeep, now)

    def _report(self, now: float) -> None:
        """The latency lines, the events' tick (skeleton quality, feed health), the errors."""
        requests = self.requests
        # The interval that passed, not the configured one: a reload may have changed
        # stats_interval since the last tick, and shutdown ticks early (rates per second).
        interval_s, self._last_stats = now - self._last_stats, now
        for record in requests.latency.drain(interval_s):
            log.info("latency", **record)
        self.events.tick(now, interval_s, list(self.cameras.cameras), self.config.server)
        requests.errors.flush()
        self._faults.flush()

    def _housekeep(self, now: float) -> None:
        """Idle cameras and retired models go, and the connections are held to their budget
        (the subscribers' by the events' tick)."""
        for camera, idle in self.cameras.reclaim_idle(now, self.config.server.idle_timeout):
            log.info("camera_reclaimed", camera=camera, idle_s=round(idle))
            self.events.forget(camera, "camera-idle")
        self._reap_retired()
        self.connections.enforce(now)

    def _check_memory(self, now: float) -> None:
        """A peer's endless or huge message grows the I/O thread's buffers; what abuse and
        bursts leave behind goes back to the system (server/memory_policy.py)."""
        requests = self.requests
        trim_asked, requests.trim_due = requests.trim_due, False
        own = self._own_growth
        if own.settled():  # the runners just made are the daemon's memory, not a peer's
            self._rebase_memory("runners made")
        self._memory.check(now, trim_asked, own_growth=self._reload is not None or own.active)

    def _rebase_memory(self, reason: str) -> None:
        """The auto limit from the size now; said where it moved (at READY: memory_limit)."""
        before = self._rss.limit
        self._rss.rebase()
        if self._rss.limit != before:
            log.info("memory_limit", rss_mb=round(self._rss.rss() / 2**20, 1),
                     limit_mb=round(self._rss.limit / 2**20, 1), reason=reason)

    def _read_waiting(self, now: float) -> bool:
        """Read the requests and subscriptions already complete in the sockets' queues, up to
        GROWTH_READ_PASSES bursts (memory_policy.py decides what waiting longer means); True
        when none was left waiting."""
        requests = self.requests
        emptied = False
        for _ in range(GROWTH_READ_PASSES if not requests.discarding else 0):
            emptied = requests.read()
            if emptied:
                break
        return self.events.read(now) and emptied

    def _watchdog(self, now: float) -> None:
        """systemd's WATCHDOG=1, held back while an executor is stuck in one batch (logged
        once a stall)."""
        stalled = self.stalled_executors(now)
        if stalled:
            if not self._stall_logged:
                log.error("watchdog_stall", executors=stalled,
                          stall_timeout=self.config.server.stall_timeout)
                self._stall_logged = True
        else:
            self._stall_logged = False
            self.notifier.watchdog()

    def _all_connections(self) -> list[Connections]:
        """The requests socket's connections and, with events, the subscribers'."""
        feed = self.events.connections
        return [self.connections] if feed is None else [self.connections, feed]

    def stalled_executors(self, now: float) -> list[str]:
        """Executors stuck in one batch longer than stall_timeout."""
        limit = self.config.server.stall_timeout
        return [ex.name for model in self.models.values() for ex in model.executors
                if ex.busy_since is not None and now - ex.busy_since > limit]

    def stats(self) -> dict[str, Any]:
        requests = self.requests
        return {"uptime_s": round(time.monotonic() - self.started, 3),
                "generation": self.generation, **requests.counters,
                **requests.process_stats(), "cameras": requests.camera_stats(),
                **self.events.stats(),
                "models": {n: m.stats() for n, m in self.models.items()}}

    # -- reload ----------------------------------------------------------------------------
    def _begin_reload(self) -> None:
        if self._reload is not None:
            log.warning("reload_ignored", reason="a reload is already running")
            return
        self.notifier.reloading()
        log.info("reload", phase="started", source=self.config.source)
        current, models, generation = self.config, self.models, self.generation + 1
        self._reload = in_thread("reload", lambda: self._load(current, models, generation))
        self._reload.add_done_callback(lambda _: self.wakeup.wake())

    def _load(self, current: Config, models: dict[str, ServedModel],
              generation: int) -> Reloaded:
        """The reload's thread: reread the keys and the file, and load what changed; new and
        changed models get their runners, warmed here, while the current ones keep serving."""
        if self.curve is not None:  # revoked keys: their requests get `forbidden`
            self.curve.reload()
        config = self._reread()
        check_config(config)  # what `config check` and a start check, as they do
        config = keep_restart_keys(config, current)
        engine_changed = [k for k in SERVER_ENGINE
                          if getattr(config.server, k) != getattr(current.server, k)]
        # A [server] engine key (engines_dir, memory plan, warm-up) is what every model is
        # loaded with: every model is loaded anew. Otherwise a model whose own engine keys
        # are unchanged is kept (its policy keys applied by _apply).
        deferred: dict[str, Pending | None] = {}
        return Reloaded(config, load_models(
            config, generation, keep=None if engine_changed else models,
            start=lambda model: self._start_model(model, config), cancel=self.wakeup.stop,
            background=True, deferred=deferred), deferred)

    def _finish_reload(self, reload: Future[Reloaded]) -> None:
        self._reload = None
        try:
            self._apply(reload.result())
            note = "reloaded"
        except BaseException as exc:  # BuildCancelled too; whatever the thread raised, it
            # stays the reload's failure (the old models serve on), never the loop's
            log.error("reload", phase="failed", error=str(exc),
                      action="still serving the previous configuration")
            note = f"reload failed: {exc}"
        self.events.drop_revoked()  # the keys were reread first, whatever else failed
        self.notifier.ready(f"serving {', '.join(self.models)} ({note})")

    def _apply(self, reloaded: Reloaded) -> None:
        """Serve the reloaded models and apply the policy keys; replaced models finish their
        queued work, then close."""
        old, (config, models, deferred) = self.models, reloaded
        self.generation += 1
        self.models = self.requests.models = models
        if self._follow_log_level and config.server.log_level != self.config.server.log_level:
            configure_logging(**{**logging_config(), "level": config.server.log_level})
            self.requests.log_requests = debug_enabled()
        self.config = config
        server = config.server
        for name, model in models.items():
            if old.get(name) is model:
                model.apply_policy(config.model(name) or model.config)
                if name in deferred:  # its runners serve on until the upgrade swaps
                    model.building = deferred[name]  # (None: asked for what serves)
            model.scheduler.queue_size = server.queue_size
        if self._sampler is not None:
            self._sampler.interval_s = server.stats_interval
        self.events.configure(models, server)  # open events stay open under the new rules
        for name, model in old.items():
            if models.get(name) is not model:
                model.stop_accepting(time.monotonic() + RETIRE_TIMEOUT_S)
                self.retiring.append(model)
        self._rebase_memory("reloaded")  # the new models' memory is theirs, not a peer's
        log.info("reload", phase="done", models=list(models), generation=self.generation,
                 loaded=[n for n, m in models.items() if old.get(n) is not m])

    def _reap_retired(self) -> None:
        for model in list(self.retiring):
            if model.drained:
                self.retiring.remove(model)
                model.close()
                if not self.retiring:
                    give_back_free_memory()  # a model's weights and buffers went back
                    self._rebase_memory("runners closed")

    # -- shutdown --------------------------------------------------------------------------
    def shutdown(self) -> int:
        requests = self.requests
        drain = self.config.server.drain_timeout
        deadline = time.monotonic() + drain
        self.notifier.stopping("draining in-flight requests")
        everything = [*self.models.values(), *self.retiring]
        log.info("shutdown_started", drain_timeout=drain,
                 queued=sum(m.scheduler.pending for m in everything),
                 reason="fatal device error" if self.wakeup.fatal else "signal")
        for model in everything:
            model.stop_accepting(deadline)
            if not model.executors:  # paused for an upgrade (server/upgrade.py): none takes it
                for job in model.scheduler.drain():
                    requests.complete(shutting_down(job), time.monotonic())
        # Keep the loop's duties while executors drain: queued work is answered (or answered
        # shutting-down after the deadline), new requests are refused with shutting-down.
        while time.monotonic() < deadline + 1.0:
            self._drive(time.monotonic())
            requests.refuse_all()
            self._watch_accepts()
            if all(model.drained for model in everything):
                break
            time.sleep(0.002)
        self._refuse_until_quiet()
        stuck = [ex.name for m in everything for ex in m.executors if ex.alive]
        if self._sampler is not None:
            self._sampler.stop(2.0)
        self._tick(time.monotonic())
        self.events.close()
        self._upgrades.close(UPGRADE_CLOSE_WAIT_S)  # made, never swapped in: never served
        if not stuck:
            for model in everything:
                model.close()
        self._close_sockets(wait=not stuck)
        self.notifier.close()
        fatal = self.wakeup.fatal
        code = 1 if (fatal or stuck) else 0
        log.info("shutdown_complete", exit_code=code, stuck_executors=stuck,
                 replies_dropped=requests.counters["replies_dropped"],
                 fatal=str(fatal) if fatal else None)
        return code

    def _refuse_until_quiet(self) -> None:
        """Clients may send until the socket closes. Refuse until none has sent for
        SHUTDOWN_QUIET_S (a client that got shutting-down stops), at most SHUTDOWN_REFUSE_S:
        a request that arrives after that is the one case that goes unanswered."""
        requests = self.requests
        end = time.monotonic() + SHUTDOWN_REFUSE_S
        quiet_from = time.monotonic()
        while True:
            now = time.monotonic()
            self._watch_accepts()
            if requests.refuse_all() or requests.discarding:
                quiet_from = now
            if now - quiet_from >= SHUTDOWN_QUIET_S or now >= end:
                return
            time.sleep(0.002)

    def _watch_accepts(self) -> None:
        """Keep the connection count in budget while shutting down too (a connection flood
        during the drain must not exhaust the fds)."""
        for connections in self._all_connections():
            connections.on_monitor(time.monotonic())

    def _close_sockets(self, wait: bool = True) -> None:
        self.connections.close()
        self._rss.close()
        # Linger: the shutting-down replies just queued leave before the socket goes.
        self._router.close(CLOSE_LINGER_MS if wait else 0)
        if self.curve is not None:
            self.curve.close()
        self._timer.close()
        self.wakeup.close()
        if wait:  # term() waits for every socket's linger
            self._ctx.term()
        if self._ipc_path is not None:
            self._ipc_path.unlink(missing_ok=True)

def startup_cancelled(notifier: Notifier) -> int:
    """SIGTERM/SIGINT arrived while the first models loaded: nothing is served, stop now."""
    notifier.stopping("stopped during start-up")
    notifier.close()
    log.info("shutdown_complete", exit_code=0, phase="startup",
             reason="signal during start-up; the engine build was abandoned")
    return 0


def keep_restart_keys(config: Config, current: Config) -> Config:
    """`config` with the running values of the keys only a restart applies; each one that
    changed is logged (reload_key_ignored), never silently ignored."""
    kept = {}
    for name in RESTART:
        value, running = getattr(config.server, name), getattr(current.server, name)
        if value != running:
            kept[name] = running
            log.warning("reload_key_ignored", key=name, value=value, kept=running,
                        reason=f"[server] {name} takes effect at a restart "
                               "(systemctl restart stgcnd)")
    if config.events != current.events:  # [events.mqtt]: its keys are restart keys
        log.warning("reload_key_ignored", key="events", reason="[events.mqtt] takes effect "
                    "at a restart (systemctl restart stgcnd)")
        config = msgspec.structs.replace(config, events=current.events)
    return msgspec.structs.replace(
        config, server=msgspec.structs.replace(config.server, **kept)) if kept else config
