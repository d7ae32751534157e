"""The daemon's life: startup -> main loop -> bounded graceful shutdown.

The main thread owns the ROUTER socket and does only cheap work: decode and check requests,
answer hello/ping/stats and every error at once, hand infer/push/reset to the camera's worker,
forward workers' replies to clients. Signal handlers only set flags; the loop acts on them.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import zmq

from stgcnd import __version__
from stgcnd.errors import BuildCancelled
from stgcnd.log import get_logger
from stgcnd.server.config import Config, load_config
from stgcnd.server.errorlog import ClientErrorLog
from stgcnd.server.models import ServedModel, load_models
from stgcnd.server.notify import Notifier
from stgcnd.server.transport import bind_router
from stgcnd.server.worker import REPLY_ENDPOINT, CameraWorker, Work
from stgcnd_client.protocol import (
    ErrorCode,
    Limits,
    ProtocolError,
    Request,
    check_frame,
    check_window,
    decode_request,
    encode_reply,
)

log = get_logger(__name__)

LOOP_TICK_MS = 100


class Server:
    def __init__(self, config: Config, config_path: Path | None = None,
                 notifier: Notifier | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.notifier = notifier or Notifier()
        self.models: dict[str, ServedModel] = {}
        self.workers: dict[str, CameraWorker] = {}
        self.generation = 1
        self.started = time.monotonic()
        self.limits = Limits(max_message_bytes=config.server.max_message_bytes)
        self.errors = ClientErrorLog()
        self.counters = {"requests": 0, "errors": 0, "busy": 0, "expired": 0}
        self._stop = threading.Event()
        self._reload_requested = threading.Event()
        self._reload_thread: threading.Thread | None = None
        self._reload_result: dict[str, ServedModel] | BaseException | None = None
        self._pending_config: Config = config
        self._fatal: BaseException | None = None
        self._ctx: zmq.Context | None = None
        self._router: zmq.Socket | None = None
        self._replies: zmq.Socket | None = None
        self._ipc_path: Path | None = None
        self.exit_code = 0
        from stgcnd.telemetry.latency import LatencyAggregator

        self.latency = LatencyAggregator()
        self._sampler: Any = None

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
            # the main thread and before any worker exists. SIGTERM/SIGINT (self._stop)
            # abandons a first-start build: BuildCancelled, nothing partial kept.
            self.models = load_models(self.config, self.generation, cancel=self._stop)
        finally:
            keepalive.set()
        self._bind()
        self._start_sampler()
        names = ", ".join(f"{m.name} ({m.backend.info.name}/{m.backend.info.precision})"
                          for m in self.models.values())
        self.notifier.ready(f"serving {names} on {self.config.endpoint}")
        log.info("ready", endpoint=self.config.endpoint, models=list(self.models),
                 version=__version__, pid=os.getpid())

    def _bind(self) -> None:
        self._ctx = zmq.Context()
        self._router, self._ipc_path = bind_router(self._ctx, self.config)
        self._replies = self._ctx.socket(zmq.PULL)
        self._replies.setsockopt(zmq.LINGER, 0)
        self._replies.bind(REPLY_ENDPOINT)

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

    # -- main loop -------------------------------------------------------------------------
    def serve(self) -> int:
        assert self._router is not None and self._replies is not None
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._replies, zmq.POLLIN)
        next_stats = time.monotonic() + self.config.server.stats_interval
        wd_interval = self.notifier.watchdog_interval
        next_watchdog = time.monotonic()
        stalled_logged = False
        while not self._stop.is_set():
            events = dict(poller.poll(LOOP_TICK_MS))
            if self._replies in events:
                self._forward_replies()
            if self._router in events:
                self._read_requests(limit=256)
            now = time.monotonic()
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self._begin_reload()
            self._finish_reload()
            if now >= next_stats:
                next_stats = now + self.config.server.stats_interval
                self._log_stats()
                self._reclaim_idle(now)
            if wd_interval and now >= next_watchdog:
                stalled = self.stalled_workers(now)
                if stalled:
                    if not stalled_logged:
                        log.error("watchdog_stall", workers=stalled,
                                  stall_timeout=self.config.server.stall_timeout)
                        stalled_logged = True
                else:
                    stalled_logged = False
                    self.notifier.watchdog()
                next_watchdog = now + wd_interval
        return self.shutdown()

    def stalled_workers(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        limit = self.config.server.stall_timeout
        return [w.camera for w in self.workers.values()
                if (w.busy_since is not None and now - w.busy_since > limit)
                or (w.busy_since is None and w.is_alive() and now - w.heartbeat > limit)]

    def _forward_replies(self) -> None:
        assert self._replies is not None
        while True:
            try:
                frames = self._replies.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._send(frames[0].bytes, frames[1:])

    def _send(self, identity: bytes, frames: list[Any]) -> None:
        assert self._router is not None
        try:
            self._router.send_multipart([identity, *frames], copy=False)
        except zmq.ZMQError as exc:  # the client vanished (EHOSTUNREACH) or is not reading
            log.debug("reply_dropped", reason=exc.strerror)

    def _reply_error(self, identity: bytes, exc: ProtocolError, req: Request | None) -> None:
        self.counters["errors"] += 1
        if req is None:
            # Undecodable: the sender's camera is unknown and identities are cheap, so these
            # are rate-limited per error code.
            self.errors.report(f"<{exc.code.value}>", exc.code.value, exc.message)
        else:
            self.errors.report(req.camera, exc.code.value, exc.message)
            if req.op in ("infer", "push"):
                model = req.model or next(iter(self.models))
                self.latency.record(req.camera, model, 0.0, "error")
        self._send(identity, encode_reply(exc.req_id, error=(exc.code.value, exc.message)))

    def _read_requests(self, limit: int) -> None:
        assert self._router is not None
        for _ in range(limit):
            try:
                msg = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            received = time.monotonic()
            identity = msg[0].bytes
            self.counters["requests"] += 1
            req = None
            try:
                req = decode_request(msg[1:], self.limits)
                self._dispatch(identity, req, received)
            except ProtocolError as exc:
                self._reply_error(identity, exc, req)
            except Exception as exc:
                log.exception("request_crashed", error=str(exc))
                self._send(identity, encode_reply(None, error=(ErrorCode.INTERNAL.value,
                                                               f"internal error: {exc}")))

    def _dispatch(self, identity: bytes, req: Request, received: float) -> None:
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
        model = self.models.get(req.model) if req.model else next(iter(self.models.values()))
        if model is None:
            raise ProtocolError(ErrorCode.UNKNOWN_MODEL,
                                f"no model named {req.model!r}; this daemon serves "
                                f"{', '.join(self.models)}", req.id)
        if op in ("infer", "push"):
            self._one_array(req)
            check = check_window if op == "infer" else check_frame
            try:
                check(req.arrays[0], model.input_shape)
            except ProtocolError as exc:  # the checks do not know the request id
                raise ProtocolError(exc.code, exc.message, req.id) from None
        deadline = None if req.timeout_ms is None else received + req.timeout_ms / 1e3
        worker = self.workers.get(req.camera)
        if worker is None or not worker.is_alive():
            if worker is None and len(self.workers) >= self.config.server.max_cameras:
                # Each camera costs a thread and sessions: a client inventing camera ids must
                # not exhaust them. Idle cameras are reclaimed after idle_timeout.
                self.counters["busy"] += 1
                self._send(identity, encode_reply(req.id, error=(
                    ErrorCode.BUSY.value, f"this daemon already serves max_cameras="
                    f"{self.config.server.max_cameras} cameras; retry later or raise "
                    "[server] max_cameras")))
                return
            worker = CameraWorker(req.camera, self._ctx, lambda: self.models,
                                  self.config.server.queue_size, self._record, self._on_fatal)
            worker.start()
            self.workers[req.camera] = worker
        if not worker.submit(Work(identity, req, model.name, received, deadline)):
            self.counters["busy"] += 1
            self.latency.record(req.camera, model.name, 0.0, "busy")
            self._send(identity, encode_reply(req.id, error=(
                ErrorCode.BUSY.value, f"camera {req.camera!r} already has "
                f"{self.config.server.queue_size} requests queued; slow down or raise "
                "queue_size")))

    @staticmethod
    def _one_array(req: Request) -> None:
        if len(req.arrays) != 1:
            raise ProtocolError(ErrorCode.MALFORMED,
                                f"{req.op} takes exactly one array, got {len(req.arrays)}", req.id)

    def _record(self, camera: str, model: str, total_ms: float, outcome: str) -> None:
        if outcome == "expired":
            self.counters["expired"] += 1
        self.latency.record(camera, model, total_ms, outcome)

    def stats(self) -> dict[str, Any]:
        return {"uptime_s": round(time.monotonic() - self.started, 3),
                "generation": self.generation, **self.counters,
                "cameras": {c: {"requests": w.requests, "queued": w.pending}
                            for c, w in self.workers.items()},
                "models": {n: {"backend": m.backend.info.name,
                               "precision": m.backend.info.precision,
                               "sessions": m.open_sessions, "warm_sessions": len(m.warm),
                               "compute_ms_ewma": round(m.compute_ms_ewma, 3)}
                           for n, m in self.models.items()}}

    def _log_stats(self) -> None:
        for record in self.latency.drain(self.config.server.stats_interval):
            log.info("latency", **record)

    def _reclaim_idle(self, now: float) -> None:
        idle = self.config.server.idle_timeout
        for camera, worker in list(self.workers.items()):
            if not worker.is_alive() or (worker.pending == 0 and worker.busy_since is None
                                         and now - worker.last_activity > idle):
                worker.stop()
                del self.workers[camera]
                log.info("camera_reclaimed", camera=camera, idle_s=round(now -
                                                                         worker.last_activity))

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
                models = load_models(config, self.generation + 1, keep=self.models)
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
        """Serve the reloaded models; retired ones close once their last session is gone."""
        old = self.models
        self.generation += 1
        self.models = models
        self.config = self._pending_config
        for name, model in old.items():
            if models.get(name) is not model:
                model.retired = True
                model.maybe_close()
        log.info("reload", phase="done", models=list(models), generation=self.generation)

    # -- shutdown --------------------------------------------------------------------------
    def shutdown(self) -> int:
        deadline = time.monotonic() + self.config.server.drain_timeout
        self.notifier.stopping("draining in-flight requests")
        log.info("shutdown_started", queued=sum(w.pending for w in self.workers.values()),
                 drain_timeout=self.config.server.drain_timeout,
                 reason="fatal device error" if self._fatal else "signal")
        for worker in self.workers.values():
            worker.drain_deadline = deadline
            threading.Thread(target=worker.stop, daemon=True).start()
        # Keep answering: queued work finishes (or is answered shutting-down after the
        # deadline); new requests are refused with shutting-down.
        while time.monotonic() < deadline + 1.0:
            alive = [w for w in self.workers.values() if w.is_alive()]
            self._drain_sockets()
            if not alive:
                break
            time.sleep(0.01)
        self._drain_sockets()
        stuck = [w.camera for w in self.workers.values() if w.is_alive()]
        if self._sampler is not None:
            self._sampler.stop(2.0)
        self._log_stats()
        for model in self.models.values():
            if not stuck:
                model.close()
        self._close_sockets()
        self.notifier.close()
        code = 1 if (self._fatal or stuck) else 0
        log.info("shutdown_complete", exit_code=code, stuck_workers=stuck,
                 fatal=str(self._fatal) if self._fatal else None)
        return code

    def _drain_sockets(self) -> None:
        self._forward_replies()
        assert self._router is not None
        while True:
            try:
                msg = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            req_id = None
            try:
                req_id = decode_request(msg[1:], self.limits).id
            except ProtocolError as exc:
                req_id = exc.req_id
            self._send(msg[0].bytes, encode_reply(req_id, error=(
                ErrorCode.SHUTTING_DOWN.value, "the daemon is shutting down; retry on restart")))

    def _close_sockets(self) -> None:
        for sock in (self._router, self._replies):
            if sock is not None:
                sock.close(0)
        if self._ctx is not None:
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
