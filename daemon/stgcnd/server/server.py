"""The daemon's life: startup -> I/O loop -> bounded graceful shutdown.

One thread, the I/O loop, owns the ROUTER socket and all per-camera state. It decodes and
checks each request, answers hello/ping/stats/reset and every error at once, turns infer and
due pushes into jobs for the model's scheduler, and sends the replies the executors hand back.
It never blocks on a client: replies go out with NOBLOCK, and a client whose queue is full
(one that sends and never reads) loses its replies, counted and logged rate-limited, while
everyone else is served. Signal handlers only set flags; the loop acts on them.

Per model, executors (server/executor.py) own the device: runners made and warmed before
READY=1, batches formed round robin across cameras by the scheduler (server/scheduler.py).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import zmq

from stgcnd import __version__, cpupower
from stgcnd.errors import BuildCancelled
from stgcnd.log import debug_enabled, get_logger
from stgcnd.server.cameras import CameraState, CameraTable, PushRecord
from stgcnd.server.config import Config, load_config
from stgcnd.server.connections import (
    Connections,
    connection_budget,
    open_fds,
    raise_fd_limit,
)
from stgcnd.server.errorlog import ClientErrorLog
from stgcnd.server.gcpause import GcWatch, freeze_survivors
from stgcnd.server.heap import CHECK_EVERY_S, RssWatch, give_back_free_memory
from stgcnd.server.loop_executor import LoopExecutor
from stgcnd.server.models import ServedModel, load_models
from stgcnd.server.notify import Notifier
from stgcnd.server.outbox import Outbox, Reply
from stgcnd.server.receive import BAN_ABOVE_FRAMES, Incoming, Receiver
from stgcnd.server.scheduler import Job
from stgcnd.server.timer import WakeTimer
from stgcnd.server.transport import NOBLOCK, NOBLOCK_MORE, bind_router, make_router
from stgcnd_client.protocol import (
    ErrorCode,
    Limits,
    ProtocolError,
    Request,
    check_frame,
    check_window,
    decode_request,
    encode_reply,
    too_many_frames,
)

log = get_logger(__name__)

LOOP_TICK_MS = 100
LATENCY_STAGES = ("queue_ms", "compute_ms")  # a reply's timings kept per camera in `latency`
READ_BURST = 256          # requests read per loop pass before replies get their turn
RETIRE_TIMEOUT_S = 30.0   # a reloaded-away model's executors drain within this
SHUTDOWN_QUIET_S = 0.1    # shutdown: the socket closes after this long without a request...
SHUTDOWN_REFUSE_S = 1.0   # ...or after refusing for this long, whichever comes first
CLOSE_LINGER_MS = 1000    # the last replies get this long to leave at close
TRIM_EVERY_S = 1.0        # over the memory limit, malloc_trim at most this often
# The I/O loop and the executors share one interpreter lock. Python's default 5 ms switch
# interval would let a busy loop hold back an executor whose batch is done for up to 5 ms;
# 0.5 ms bounds that hand-over at a cost of a few hundred extra switches per second.
GIL_SWITCH_INTERVAL_S = 0.0005


class Server:
    def __init__(self, config: Config, config_path: Path | None = None,
                 notifier: Notifier | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.notifier = notifier or Notifier()
        self.models: dict[str, ServedModel] = {}
        self.retiring: list[ServedModel] = []
        self.cameras = CameraTable(config.server.max_cameras)
        self.generation = 1
        self.started = time.monotonic()
        self.limits = Limits(max_message_bytes=config.server.max_message_bytes)
        self.errors = ClientErrorLog()
        self.counters = {"requests": 0, "errors": 0, "busy": 0, "expired": 0,
                         "replies_dropped": 0}
        self._stop = threading.Event()
        self._reload_requested = threading.Event()
        self._reload_thread: threading.Thread | None = None
        self._reload_result: dict[str, ServedModel] | BaseException | None = None
        self._pending_config: Config = config
        self._fatal: BaseException | None = None
        self._ctx = zmq.Context()
        self.outbox = Outbox(self._ctx)
        self._timer = WakeTimer()  # loop-driven executors' next look (poll wakes on it)
        self.gc_watch = GcWatch()
        self._router: zmq.Socket | None = None
        self._ipc_path: Path | None = None
        self._receiver: Receiver | None = None
        self.connections: Connections | None = None
        self._trim_due = False  # abuse left memory behind: give it back at the stats tick
        # (fd, peer) of an oversized message, banned once the rest of it is dropped
        self._ban_when_discarded: tuple[int, str] | None = None
        self._rss: RssWatch | None = None
        self._next_trim = 0.0
        from stgcnd.telemetry.latency import LatencyAggregator

        self.latency = LatencyAggregator()
        self._sampler: Any = None
        self._log_requests = debug_enabled()  # per-request events only at --log-level debug

    # -- signals ---------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        signal.signal(signal.SIGHUP, lambda *_: self._reload_requested.set())

    def request_stop(self) -> None:
        self._stop.set()

    def _on_fatal(self, exc: BaseException) -> None:
        self._fatal = exc
        self._stop.set()

    # -- startup ---------------------------------------------------------------------------
    def startup(self) -> None:
        keepalive = threading.Event()

        def extend() -> None:  # first-run engine builds take minutes on a Jetson
            while not keepalive.wait(20.0):
                self.notifier.extend_timeout(60.0)

        self.notifier.extend_timeout(60.0)
        self.notifier.status("building or loading engines")
        ext = threading.Thread(target=extend, name="extend-timeout", daemon=True)
        ext.start()
        try:
            # Backends create or retain the process's one CUDA context as they load, here in
            # the main thread; each executor then prepares and warms its own runner.
            # SIGTERM/SIGINT (self._stop) abandons a first-start build: BuildCancelled,
            # nothing partial kept.
            self.models = load_models(self.config, self.generation, start=self._start_model,
                                      cancel=self._stop)
        finally:
            keepalive.set()
        self._router = make_router(self._ctx, self.config)
        self._watch_connections()  # before the bind: no connection accepted unseen
        self._ipc_path = bind_router(self._router, self.config)
        self._receiver = Receiver(self._router)
        self._start_sampler()
        self._freeze_heap("startup")
        self.gc_watch.install()  # after start-up's own collections: it reports serving's
        names = ", ".join(f"{m.name} ({m.backend.info.name}/{m.backend.info.precision})"
                          for m in self.models.values())
        self.notifier.ready(f"serving {names} on {self.config.endpoint}")
        # Without a timerfd the loop comes back for a batch in whole milliseconds (see
        # server/timer.py), and deep idle states and low clocks slow every request that
        # follows an idle gap (stgcnd/cpupower.py): both worth a line where latency is read.
        log.info("ready", endpoint=self.config.endpoint, models=list(self.models),
                 version=__version__, pid=os.getpid(),
                 loop_timer="timerfd" if self._timer.fd is not None else "poll-ms",
                 cpu_power=cpupower.summary(cpupower.cpu_power()))

    def _watch_connections(self) -> None:
        """Count connections against the fd budget (server/connections.py)."""
        assert self._router is not None
        before, soft, hard = raise_fd_limit()
        in_use = open_fds()
        cap, mark = connection_budget(soft, in_use, self.config.server.max_connections)
        self.connections = Connections(self._ctx, self._router, cap, mark)
        log.info("fd_limit", soft_before=before, soft=soft, hard=hard, open=in_use,
                 max_connections=cap, hard_mark=mark)
        self._rss = RssWatch(self.config.server.max_rss_mb)
        log.info("memory_limit", rss_mb=round(self._rss.rss() / 2**20, 1),
                 limit_mb=round(self._rss.limit / 2**20, 1),
                 action="over it, connections quiet for a second are closed")

    def _check_memory(self, now: float) -> None:
        """A peer's endless message grows the I/O thread's buffers (server/heap.py)."""
        assert self._rss is not None and self.connections is not None
        if not self._rss.over():
            return
        if now >= self._next_trim:  # what is merely free goes back first (once a second)
            self._next_trim = now + TRIM_EVERY_S
            give_back_free_memory()
        rss = self._rss.over()
        if rss:
            closed = self.connections.shed_quiet(now)
            self.errors.report("memory-pressure", event="memory_pressure",
                               rss_mb=round(rss / 2**20, 1),
                               limit_mb=round(self._rss.limit / 2**20, 1), closed=closed)

    def _freeze_heap(self, when: str) -> None:
        """Exempt what is alive now from the collector's later passes (server/gcpause.py)."""
        if not self.config.server.gc_freeze:
            return
        started = time.monotonic()
        frozen = freeze_survivors()
        log.info("gc_frozen", when=when, objects=frozen,
                 ms=round((time.monotonic() - started) * 1e3, 1))

    def _start_model(self, model: ServedModel) -> None:
        s = self.config.server
        lanes = s.max_cameras if model.config.client_streams else 0
        model.start(self.outbox, s.queue_size, lanes, s.warmup_runs, self._on_fatal)

    def _start_sampler(self) -> None:
        if not self.config.server.system_stats:
            return
        try:
            from stgcnd.telemetry.sampler import SystemSampler
        except ImportError:
            return
        self._sampler = SystemSampler(self.config.server.stats_interval,
                                      lambda fields: log.info("system", **fields),
                                      tegrastats_path=self.config.server.tegrastats)
        self._sampler.start()

    # -- the I/O loop ----------------------------------------------------------------------
    def serve(self) -> int:
        assert self._router is not None
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self.outbox.reader, zmq.POLLIN)
        connections, receiver = self.connections, self._receiver
        assert connections is not None and receiver is not None
        poller.register(connections.monitor, zmq.POLLIN)
        timer = self._timer
        if timer.fd is not None:
            poller.register(timer.fd, zmq.POLLIN)
        timeout = LOOP_TICK_MS
        next_stats = time.monotonic() + self.config.server.stats_interval
        next_memory_check = time.monotonic()
        wd_interval = self.notifier.watchdog_interval
        next_watchdog = time.monotonic()
        stalled_logged = False
        while not self._stop.is_set():
            self._wake_executors()  # last before poll releases the GIL (Scheduler.wake)
            events = dict(poller.poll(timeout))
            if timer.fd in events:
                timer.fired()
            if connections.monitor in events:
                connections.on_monitor(time.monotonic())
            self._deliver()
            if self._router in events or receiver.discarding:
                self._read_requests(READ_BURST)
            now = time.monotonic()
            timeout = self._drive(now)
            if receiver.discarding:
                timeout = 0  # the rest of an oversized message: another chunk next pass
            elif self._ban_when_discarded is not None:
                self._ban_oversized_sender(now)
            if now >= next_memory_check:
                next_memory_check = now + CHECK_EVERY_S
                self._check_memory(now)
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self._begin_reload()
            self._finish_reload()
            if now >= next_stats:
                next_stats = now + self.config.server.stats_interval
                self._log_stats()
                self._reclaim_idle(now)
                self._reap_retired()
                connections.enforce(now)
                if self._trim_due:
                    self._trim_due = False
                    give_back_free_memory()
            if wd_interval and now >= next_watchdog:
                stalled = self.stalled_executors(now)
                if stalled:
                    if not stalled_logged:
                        log.error("watchdog_stall", executors=stalled,
                                  stall_timeout=self.config.server.stall_timeout)
                        stalled_logged = True
                else:
                    stalled_logged = False
                    self.notifier.watchdog()
                next_watchdog = now + wd_interval
        return self.shutdown()

    def _drive(self, now: float) -> int:
        """Turn every loop-driven executor (finish done batches, launch queued work), send
        their replies, arm the timer for the next look; the poll timeout to use (ms)."""
        next_look: float | None = None
        for model in (*self.models.values(), *self.retiring):
            for ex in model.executors:
                if isinstance(ex, LoopExecutor) and ex.is_alive():
                    try:
                        replies, look = ex.drive(now)
                    except Exception as exc:  # the runner's own errors are answered inside
                        # A daemon or driver bug outside a batch (e.g. attaching the
                        # device): stop gracefully, exit 1, and let systemd restart us.
                        log.error("executor_failed", executor=ex.name,
                                  error=f"{type(exc).__name__}: {exc}",
                                  traceback=traceback.format_exc(limit=8))
                        self._on_fatal(exc)
                        for reply in ex.abandon(exc):  # every request still gets its reply
                            self._complete(reply)
                        continue
                    for reply in replies:
                        self._complete(reply)
                    if look is not None and (next_look is None or look < next_look):
                        next_look = look
        timer = self._timer
        if next_look is None:
            timer.disarm()
            return LOOP_TICK_MS
        if timer.fd is not None:
            timer.arm(next_look)
            return LOOP_TICK_MS
        # No timerfd (not Linux): whole milliseconds, rounded up, at least one.
        return min(max(math.ceil((next_look - time.monotonic()) * 1e3), 1), LOOP_TICK_MS)

    def _wake_executors(self) -> None:
        for model in self.models.values():
            if model.scheduler is not None:
                model.scheduler.wake()

    def stalled_executors(self, now: float | None = None) -> list[str]:
        """Executors stuck in one batch, or whose loop stopped turning (gunicorn's arbiter:
        liveness is a monotonic timestamp the worker refreshes itself)."""
        now = time.monotonic() if now is None else now
        limit = self.config.server.stall_timeout
        out = []
        for model in self.models.values():
            for ex in model.executors:
                busy = ex.busy_since
                if (busy is not None and now - busy > limit) or (
                        busy is None and ex.is_alive() and now - ex.heartbeat > limit):
                    out.append(ex.name)
        return out

    def _send(self, identity: bytes, frames: list[Any]) -> bool:
        """Send without ever blocking the loop; False when the reply was dropped."""
        assert self._router is not None
        send = self._router.send
        try:
            # Frame by frame with plain-int flags: send_multipart combines enum flags per frame,
            # which showed up in the loop's profile. Only the first frame can be refused
            # (routing); once it is queued the rest of the message always is.
            send(identity, NOBLOCK_MORE)
            last = len(frames) - 1
            for i, frame in enumerate(frames):
                send(frame, NOBLOCK if i == last else NOBLOCK_MORE)
            return True
        except zmq.Again:
            # The client's queue is full: it sends and does not read. Blocking here would
            # freeze every camera; its reply is dropped instead.
            reason = "client is not reading its replies (its queue is full)"
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the client is gone
            reason = f"client gone ({exc.strerror})"
        self.counters["replies_dropped"] += 1
        self._trim_due = True
        self.errors.report("reply-dropped", event="reply_dropped", reason=reason)
        return False

    def _deliver(self) -> None:
        """Send the replies the executors finished, and settle the cameras' bookkeeping."""
        for reply in self.outbox.take_all():
            self._complete(reply)

    def _complete(self, reply: Reply) -> None:
        """Settle a finished job's bookkeeping and send its reply."""
        job = reply.job
        cam = self.cameras.cameras.get(job.camera)
        if cam is not None:
            cam.in_flight -= 1
            if job.op == "push" and reply.outcome == "ok":
                rec = cam.pushes.get(job.model)
                if rec is not None and rec.req_id == job.req_id:
                    rec.reply = reply.frames
        self._record(job, reply)
        self._send(job.identity, reply.frames)

    def _record(self, job: Job, reply: Reply) -> None:
        outcome = reply.outcome
        if outcome == "expired":
            self.counters["expired"] += 1
        elif outcome != "ok":
            self.counters["errors"] += 1
            outcome = "error"
        t = reply.timings
        total_ms = t.get("total_ms")
        if total_ms is None:
            total_ms = (time.monotonic() - job.received) * 1e3
        if job.camera in self.cameras.cameras:  # bounded: only cameras in the table
            self.latency.record(job.camera, job.model, total_ms, outcome, t, LATENCY_STAGES)
        # Per request, at debug level only (`--log-level debug`): exact percentiles for
        # `stgcnd logs summarize`; free when the level filters it out.
        if self._log_requests:
            log.debug("request", camera=job.camera, model=job.model, request_id=job.req_id,
                      outcome=outcome, total_ms=round(total_ms, 3),
                      **{k: v for k, v in t.items() if k != "total_ms"})

    def _read_requests(self, limit: int) -> None:
        receiver = self._receiver
        assert receiver is not None
        for _ in range(limit):
            msg = receiver.read()
            if msg is None:
                return
            if msg.too_many:
                self._refuse_oversized(msg)
                return
            self._handle(msg, time.monotonic())

    def _refuse_oversized(self, msg: Incoming) -> None:
        """More frames than any request has: one too-large reply, the rest of the message
        dropped over the next loop passes, then the peer banned if it was huge
        (server/receive.py)."""
        self.counters["requests"] += 1
        self.counters["errors"] += 1
        self._trim_due = True
        req_id = _request_id(msg.frames[0], self.limits)
        message = too_many_frames(self.limits)
        self.errors.report(ErrorCode.TOO_LARGE.value, message=message)
        self._send(msg.identity, encode_reply(req_id, error=(ErrorCode.TOO_LARGE.value,
                                                             message)))
        self._ban_when_discarded = (msg.fd, msg.peer)  # once the rest of it is dropped

    def _ban_oversized_sender(self, now: float) -> None:
        assert self._ban_when_discarded is not None and self._receiver is not None
        fd, peer = self._ban_when_discarded
        self._ban_when_discarded = None
        frames = self._receiver.last_oversized_frames
        if frames > BAN_ABOVE_FRAMES and self.connections is not None:
            self.connections.ban(fd, peer, now, reason=f"a message of {frames} frames")

    def _handle(self, msg: Incoming, received: float) -> None:
        self.counters["requests"] += 1
        identity = msg.identity
        peer = msg.peer
        if self.connections is not None and not self.connections.seen(msg.fd, peer, received):
            return  # a banned peer's connection, closing: nobody reads an answer there
        req = None
        try:
            req = decode_request(msg.frames, self.limits)
            self._dispatch(identity, req, received, peer)
        except ProtocolError as exc:
            self._reject(identity, exc, req)
        except Exception as exc:  # a daemon bug: answered, logged rate-limited, never fatal
            self.counters["errors"] += 1
            self.errors.report("internal", event="request_crashed", camera=getattr(
                req, "camera", None), error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(limit=8))
            self._send(identity, encode_reply(getattr(req, "id", None), error=(
                ErrorCode.INTERNAL.value, f"internal error: {type(exc).__name__}: {exc}")))

    def _reject(self, identity: bytes, exc: ProtocolError, req: Request | None) -> None:
        self.counters["busy" if exc.code == ErrorCode.BUSY else "errors"] += 1
        req_id = exc.req_id if exc.req_id is not None else getattr(req, "id", None)
        self.errors.report(exc.code.value, camera=getattr(req, "camera", None),
                           message=exc.message)
        if req is not None and req.op in ("infer", "push") and req.camera in \
                self.cameras.cameras:
            self.latency.record(req.camera, req.model or next(iter(self.models)), 0.0,
                                "busy" if exc.code == ErrorCode.BUSY else "error")
        self._send(identity, encode_reply(req_id, error=(exc.code.value, exc.message)))

    def _dispatch(self, identity: bytes, req: Request, received: float, peer: str) -> None:
        op = req.op
        if op == "ping":
            self._send(identity, encode_reply(req.id, {"pong": True, "server_time": time.time()}))
            return
        if op == "hello":
            default = next(iter(self.models))
            self._send(identity, encode_reply(req.id, {
                "server": __version__, "protocol": 1, "camera": req.camera,
                "models": [m.describe(name == default) for name, m in self.models.items()]}))
            return
        if op == "stats":
            self._send(identity, encode_reply(req.id, self.stats()))
            return
        if op == "reset":
            self._reset(identity, req)
            return
        model = self._model(req)
        check = check_window if op == "infer" else check_frame
        try:
            check(req.arrays[0], model.input_shape)
        except ProtocolError as exc:  # the checks do not know the request id
            raise ProtocolError(exc.code, exc.message, req.id) from None
        cam, evicted = self.cameras.get(req.camera, received, peer)
        if cam is None:
            # Each camera holds a lane on every executor: a client inventing camera ids must
            # not exhaust them (server/cameras.py says who gives way to whom).
            raise ProtocolError(ErrorCode.BUSY, (
                f"this daemon already serves max_cameras={self.cameras.max_cameras} cameras "
                "and none of them can give way yet; retry in a few seconds or raise [server] "
                "max_cameras"), req.id)
        if evicted is not None:
            self.errors.report("camera-evicted", event="camera_evicted", camera=evicted.camera,
                               peer=evicted.peer, idle_s=evicted.idle_s, rule=evicted.rule,
                               by=req.camera)
        cam.requests += 1
        deadline = None if req.timeout_ms is None else received + req.timeout_ms / 1e3
        if op == "infer":
            self._submit(identity, req, cam, model, req.arrays[0], {}, received, deadline)
        else:
            self._push(identity, req, cam, model, received, deadline)

    def _model(self, req: Request) -> ServedModel:
        if req.model is None:
            return next(iter(self.models.values()))
        model = self.models.get(req.model)
        if model is None:
            raise ProtocolError(ErrorCode.UNKNOWN_MODEL,
                                f"no model named {req.model!r}; this daemon serves "
                                f"{', '.join(self.models)}", req.id)
        return model

    def _reset(self, identity: bytes, req: Request) -> None:
        # No model named: every model's push state of this camera (as protocol.md says).
        names = [self._model(req).name] if req.model is not None else list(self.models)
        cam = self.cameras.cameras.get(req.camera)
        if cam is not None:
            cam.reset(names)
        self._send(identity, encode_reply(req.id, {"reset": names}))

    def _submit(self, identity: bytes, req: Request, cam: CameraState, model: ServedModel,
                window: Any, extra: dict[str, Any], received: float,
                deadline: float | None) -> None:
        job = Job(identity, req.id, cam.name, model.name, req.op, window, cam.lane, received,
                  deadline, extra)
        if not model.submit(job, wake=False):  # the loop wakes an executor before it polls
            raise ProtocolError(ErrorCode.BUSY, (
                f"camera {cam.name!r} already has {self.config.server.queue_size} requests "
                "queued; slow down or raise [server] queue_size"), req.id)
        cam.in_flight += 1

    def _push(self, identity: bytes, req: Request, cam: CameraState, model: ServedModel,
              received: float, deadline: float | None) -> None:
        rec = cam.pushes.get(model.name)
        if rec is not None and rec.req_id == req.id:
            # A resend (the client timed out or got busy/expired): the frame is in the ring
            # already and is never appended twice.
            if rec.reply is not None:
                self._send(identity, rec.reply)
            elif rec.window is not None:
                self._submit(identity, req, cam, model, rec.window, rec.extra, received,
                             deadline)
            return
        ring = cam.ring(model.name, model.input_shape, model.config.stride)
        due = ring.append(req.arrays[0])
        extra = {"model": model.name, "ready": due, "frames": ring.buffered,
                 "seq": ring.received}
        if not due:
            reply = encode_reply(req.id, extra)
            cam.pushes[model.name] = PushRecord(req.id, extra, reply=reply)
            self._send(identity, reply)
            return
        window = ring.window()  # a copy: later frames do not change this prediction
        cam.pushes[model.name] = PushRecord(req.id, extra, window=window)
        self._submit(identity, req, cam, model, window, extra, received, deadline)

    def stats(self) -> dict[str, Any]:
        return {"uptime_s": round(time.monotonic() - self.started, 3),
                "generation": self.generation, **self.counters,
                "pid": os.getpid(), "process_cpu_s": round(time.process_time(), 6),
                "cameras": {c: {"requests": s.requests, "in_flight": s.in_flight,
                                "lane": s.lane}
                            for c, s in self.cameras.cameras.items()},
                "models": {n: m.stats() for n, m in self.models.items()},
                "camera_evictions": self.cameras.evictions,
                "connections": self.connections.stats() if self.connections else {},
                "oversized_messages": self._receiver.oversized_messages
                if self._receiver else 0,
                "gc": self.gc_watch.stats()}

    def _log_stats(self) -> None:
        for record in self.latency.drain(self.config.server.stats_interval):
            log.info("latency", **record)
        log.info("gc", **self.gc_watch.stats())
        self.errors.flush()

    def _reclaim_idle(self, now: float) -> None:
        for camera, idle in self.cameras.reclaim_idle(now, self.config.server.idle_timeout):
            log.info("camera_reclaimed", camera=camera, idle_s=round(idle))

    # -- reload ----------------------------------------------------------------------------
    def _begin_reload(self) -> None:
        if self._reload_thread is not None:
            log.warning("reload_ignored", reason="a reload is already running")
            return
        self.notifier.reloading()
        log.info("reload", phase="started", source=str(self.config_path or "defaults"))

        def work() -> None:
            try:
                config = load_config(self.config_path)
                if config.endpoint != self.config.endpoint:
                    log.warning("reload_endpoint_ignored", endpoint=config.endpoint,
                                reason="changing the endpoint needs a restart")
                if config.server.max_cameras != self.config.server.max_cameras:
                    log.warning("reload_max_cameras_ignored",
                                max_cameras=config.server.max_cameras,
                                reason="changing max_cameras needs a restart")
                # New and changed models get their own executors, warmed here, while the
                # current ones keep serving.
                models = load_models(config, self.generation + 1, keep=self.models,
                                     start=self._start_model, cancel=self._stop)
                self._reload_result = models
                self._pending_config = config
            except BaseException as exc:
                self._reload_result = exc

        self._reload_thread = threading.Thread(target=work, name="reload", daemon=True)
        self._reload_thread.start()

    def _finish_reload(self) -> None:
        if self._reload_thread is None or self._reload_thread.is_alive():
            return
        self._reload_thread = None
        result, self._reload_result = self._reload_result, None
        if isinstance(result, BaseException):
            log.error("reload", phase="failed", error=str(result),
                      action="still serving the previous configuration")
            note = f"reload failed: {result}"
        else:
            if result is not None:
                self._swap_models(result)
            note = "reloaded"
        self.notifier.ready(f"serving {', '.join(self.models)} ({note})")

    def _swap_models(self, models: dict[str, ServedModel]) -> None:
        """Serve the reloaded models; replaced ones finish their queued work, then close."""
        old = self.models
        self.generation += 1
        self.models = models
        self.config = self._pending_config
        for name, model in old.items():
            if models.get(name) is not model:
                model.stop_accepting(time.monotonic() + RETIRE_TIMEOUT_S)
                self.retiring.append(model)
        if self._rss is not None:
            self._rss.rebase()  # the new models' memory is theirs, not a peer's
        log.info("reload", phase="done", models=list(models), generation=self.generation)

    def _reap_retired(self) -> None:
        for model in list(self.retiring):
            if not any(ex.is_alive() for ex in model.executors):
                self.retiring.remove(model)
                model.close()
                if not self.retiring:
                    # What was frozen before holds the retired models: one full pass frees
                    # any cycles among them and freezes the new ones (once per reload).
                    self._freeze_heap("reload")
                    give_back_free_memory()
                    if self._rss is not None:
                        self._rss.rebase()

    # -- shutdown --------------------------------------------------------------------------
    def shutdown(self) -> int:
        drain = self.config.server.drain_timeout
        deadline = time.monotonic() + drain
        self.notifier.stopping("draining in-flight requests")
        everything = [*self.models.values(), *self.retiring]
        log.info("shutdown_started", drain_timeout=drain,
                 queued=sum(m.scheduler.pending for m in everything if m.scheduler),
                 reason="fatal device error" if self._fatal else "signal")
        for model in everything:
            model.stop_accepting(deadline)
        # Keep the loop's duties while executors drain: queued work is answered (or answered
        # shutting-down after the deadline), new requests are refused with shutting-down.
        while time.monotonic() < deadline + 1.0:
            self._deliver()
            self._drive(time.monotonic())
            self._refuse_new()
            self._watch_accepts()
            if not any(ex.is_alive() for m in everything for ex in m.executors):
                break
            time.sleep(0.005)
        self._deliver()
        self._drive(time.monotonic())
        self._refuse_until_quiet()
        stuck = [ex.name for m in everything for ex in m.executors if ex.is_alive()]
        if self._sampler is not None:
            self._sampler.stop(2.0)
        self._log_stats()
        if not stuck:
            for model in everything:
                model.close()
        self._close_sockets(wait=not stuck)
        self.notifier.close()
        code = 1 if (self._fatal or stuck) else 0
        log.info("shutdown_complete", exit_code=code, stuck_executors=stuck,
                 replies_dropped=self.counters["replies_dropped"],
                 fatal=str(self._fatal) if self._fatal else None)
        return code

    def _refuse_new(self) -> int:
        """Answer shutting-down to every request waiting; how many there were."""
        if self._receiver is None:
            return 0
        for count in range(READ_BURST):
            msg = self._receiver.read()
            if msg is None:
                return count
            self._send(msg.identity, encode_reply(_request_id(msg.frames[0], self.limits) if
                                                  msg.frames else None, error=(
                ErrorCode.SHUTTING_DOWN.value, "the daemon is shutting down; retry on restart")))
        return READ_BURST

    def _refuse_until_quiet(self) -> None:
        """Clients may send until the socket closes. Refuse until none has sent for
        SHUTDOWN_QUIET_S (a client that got shutting-down stops), at most SHUTDOWN_REFUSE_S:
        a request that arrives after that is the one case that goes unanswered."""
        end = time.monotonic() + SHUTDOWN_REFUSE_S
        quiet_from = time.monotonic()
        while True:
            now = time.monotonic()
            self._watch_accepts()
            if self._refuse_new() or (self._receiver is not None and
                                      self._receiver.discarding):
                quiet_from = now
            if now - quiet_from >= SHUTDOWN_QUIET_S or now >= end:
                return
            time.sleep(0.002)

    def _watch_accepts(self) -> None:
        """Keep the connection count in budget while shutting down too (a connection flood
        during the drain must not exhaust the fds)."""
        if self.connections is not None:
            self.connections.on_monitor(time.monotonic())

    def _close_sockets(self, wait: bool = True) -> None:
        if self.connections is not None:
            self.connections.close()
        if self._rss is not None:
            self._rss.close()
        if self._router is not None:
            # Linger: the shutting-down replies just queued leave before the socket goes.
            self._router.close(CLOSE_LINGER_MS if wait else 0)
        self.outbox.close()
        self._timer.close()
        if wait:  # term() waits for every executor's socket: a stuck one would hang exit
            self._ctx.term()
        if self._ipc_path is not None:
            self._ipc_path.unlink(missing_ok=True)

    def startup_cancelled(self) -> int:
        """SIGTERM/SIGINT arrived during startup(): nothing is served yet, stop at once."""
        self.notifier.stopping("stopped during start-up")
        self.notifier.close()
        log.info("shutdown_complete", exit_code=0, phase="startup",
                 reason="signal during start-up; the engine build was abandoned")
        return 0


def run_server(config: Config, config_path: Path | None = None) -> int:
    server = Server(config, config_path)
    server.install_signal_handlers()
    try:
        server.startup()
    except BuildCancelled:
        return server.startup_cancelled()
    return server.serve()


def _request_id(header: Any, limits: Limits) -> int | None:
    """The id of a request whose header may be all that can be read of it."""
    try:
        return decode_request([header], limits).id
    except ProtocolError as exc:
        return exc.req_id
    except Exception:
        return None
