"""The request path, on the I/O loop: read, decode, admit, queue or answer, reply.

It never blocks on a client: replies go out with NOBLOCK, and a client whose queue is full
(one that sends and never reads) loses its replies, counted and logged rate-limited, while
everyone else is served. Every request gets exactly one reply: an answer, or an error with a
stable code (stgcnd_client.protocol.ErrorCode); a daemon bug answers `internal`, never kills.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zmq

from stgcnd import __version__
from stgcnd.log import debug_enabled, get_logger
from stgcnd.server.admission import admit, model_for
from stgcnd.server.cameras import MAX_WAITING, CameraState, CameraTable, Sent
from stgcnd.server.connections import Connections
from stgcnd.server.curve_policy import ClientKey, KeyHandler
from stgcnd.server.errorlog import ClientErrorLog
from stgcnd.server.event_hub import EventHub
from stgcnd.server.executor import Reply
from stgcnd.server.models import ServedModel
from stgcnd.server.receive import BAN_ABOVE_FRAMES, Incoming, Receiver
from stgcnd.server.scheduler import Job
from stgcnd.server.transport import NOBLOCK, NOBLOCK_MORE, send_frame
from stgcnd.telemetry.latency import LatencyAggregator
from stgcnd_client.protocol import (
    ErrorCode,
    ErrorInfo,
    Limits,
    ProtocolError,
    Reason,
    Request,
    decode_request,
    encode_reply,
    too_many_frames,
)

log = get_logger(__name__)

READ_BURST = 256          # requests read per loop pass before replies get their turn
LATENCY_STAGES = ("queue_ms", "compute_ms")  # a reply's timings kept per camera in `latency`
# `ts` bound (docs/protocol.md): a clock's seconds, Unix time until the year 5138 or a
# recording's own. The events count in whole milliseconds (int), and add their hold and
# cooldown seconds to it: within 1e11 s a float still resolves 0.02 ms and nothing overflows,
# where 1e306 s made the milliseconds inf and round(inf) raised on the I/O loop (issue #41).
MAX_TS_S = 1e11


class RequestPath:
    def __init__(self, router: zmq.Socket[bytes], connections: Connections, cameras: CameraTable,
                 limits: Limits, stats: Callable[[], dict[str, Any]],
                 events: EventHub) -> None:
        self.router = router
        self.receiver = Receiver(router, loopback=connections.loopback)
        self.connections = connections
        self.cameras = cameras
        self.limits = limits
        self.models: dict[str, ServedModel] = {}   # the server swaps it on reload
        self.stats = stats
        self.errors = ClientErrorLog()
        self.latency = LatencyAggregator()
        # Told of every infer and push once, where it is decided (frame or refused), of
        # every prediction, and of a camera reset, evicted or met by a fault.
        self.events = events
        # This request's pose counted (events.frame, which counts it sent): a refusal after
        # that (_reject), whatever its reason, does not count it sent again.
        self._counted = False
        self.counters = {"requests": 0, "errors": 0, "busy": 0, "expired": 0,
                         "replies_dropped": 0}
        self.trim_due = False  # abuse left memory behind: give it back at the stats tick
        # (fd, peer) of an oversized message, banned once the rest of it is dropped
        self._ban_when_discarded: tuple[int, str] | None = None
        self.log_requests = debug_enabled()  # per-request events only at log level debug
        self.curve: KeyHandler | None = None  # CURVE on: each request's key, and its cameras
        # CURVE: requests answered `forbidden`, by key name (bounded by the keys authorized)
        self.forbidden_by_key: dict[str, int] = {}

    def use_curve(self, curve: KeyHandler) -> None:
        self.curve = curve
        self.receiver.users = True

    # -- reading ---------------------------------------------------------------------------
    def read(self, limit: int = READ_BURST, waiting: bool = False) -> bool:
        """Handle up to `limit` waiting requests (fewer while an oversized one is dropped);
        True when none was left waiting. `waiting`: the loop's poll said one is."""
        receiver = self.receiver
        emptied = False
        for _ in range(limit):
            msg = receiver.read(waiting)
            waiting = False
            if msg is None:
                emptied = not receiver.discarding
                break
            if msg.too_many:
                self._refuse_oversized(msg)
                break
            self._handle(msg, time.monotonic())
        if not receiver.discarding and self._ban_when_discarded is not None:
            self._ban_oversized_sender(time.monotonic())
        return emptied

    @property
    def discarding(self) -> bool:
        return self.receiver.discarding

    def refuse_all(self) -> int:
        """Shutdown: answer shutting-down to every request waiting; how many there were."""
        for count in range(READ_BURST):
            msg = self.receiver.read()
            if msg is None:
                return count
            self.send(msg.identity, encode_reply(
                request_id(msg.frames[0], self.limits) if msg.frames else None,
                error=ProtocolError(ErrorCode.SHUTTING_DOWN, "the daemon is shutting down; "
                                    "retry on restart", reason=Reason.STOPPING)))
        return READ_BURST

    def _refuse_oversized(self, msg: Incoming) -> None:
        """More frames than any request has: one too-large reply, the rest of the message
        dropped over the next loop passes, then the peer banned if it was huge."""
        self.counters["requests"] += 1
        self.counters["errors"] += 1
        self.trim_due = True
        self.connections.seen(msg.fd, msg.peer, time.monotonic(), msg.identity)  # owed a reply
        message = too_many_frames(self.limits)
        self.errors.report(ErrorCode.TOO_LARGE.value, message=message)
        self.send(msg.identity, encode_reply(request_id(msg.frames[0], self.limits),
                                             error=(ErrorCode.TOO_LARGE.value, message)))
        self._ban_when_discarded = (msg.fd, msg.peer)

    def _ban_oversized_sender(self, now: float) -> None:
        assert self._ban_when_discarded is not None
        fd, peer = self._ban_when_discarded
        self._ban_when_discarded = None
        frames = self.receiver.last_oversized_frames
        if frames > BAN_ABOVE_FRAMES:
            self.connections.ban(fd, peer, now, reason=f"a message of {frames} frames")

    # -- one request -----------------------------------------------------------------------
    def _handle(self, msg: Incoming, received: float) -> None:
        self.counters["requests"] += 1
        self._counted = False
        if not self.connections.seen(msg.fd, msg.peer, received, msg.identity):
            return  # a banned peer's connection, closing: nobody reads an answer there
        identity = msg.identity
        key = None
        if self.curve is not None:
            key = self.curve.keys.get(msg.user)
        req = None
        try:
            req = decode_request(msg.frames, self.limits)
            if self.curve is not None and key is None:
                # Its key was revoked (SIGHUP) after it connected; new connections with it
                # fail the handshake. Every request still gets its one answer.
                self.curve.dropped += 1
                raise ProtocolError(ErrorCode.FORBIDDEN, "this client's CURVE key was revoked; "
                                    "ask the daemon's operator for a new one (`stgcnd keys "
                                    "create`)", req.id)
            if key is not None and not key.allows(req.camera):
                raise ProtocolError(ErrorCode.FORBIDDEN, forbidden(key, req.camera), req.id)
            op = req.op
            if op == "infer" or op == "push":  # nearly every request
                self._stream(identity, req, received, msg.peer)
            else:
                self._control(identity, req, key)
        except ProtocolError as exc:  # refused before a push's frame reached any window
            self._reject(identity, exc, req, key, appended=False)
        except Exception as exc:  # a daemon bug: that camera's, never the loop's
            self.send(identity, self.fault(getattr(req, "id", None), getattr(
                req, "camera", None), exc, "request"))

    def _reject(self, identity: bytes, exc: ProtocolError, req: Request | None,
                key: ClientKey | None = None, appended: bool = False) -> None:
        """A refusal's reply, counted and logged; `appended`: for a push, whether its frame is
        in the window (said by the path that appended it or not, docs/protocol.md §3)."""
        busy = exc.code == ErrorCode.BUSY
        self.counters["busy" if busy else "errors"] += 1
        req_id = exc.req_id if exc.req_id is not None else getattr(req, "id", None)
        if exc.code == ErrorCode.FORBIDDEN:
            # Its sender may not speak for the camera it named: nothing of that camera's
            # (latency, feed health, the log's camera) is charged; its key is.
            self._refuse_key(identity, exc, req, key, req_id)  # its frame never reached a window
            return
        self.errors.report(exc.code.value, camera=getattr(req, "camera", None),
                           message=exc.message)
        if req is not None and req.op in ("infer", "push"):
            known = req.camera in self.cameras.cameras
            if known:
                self.latency.record(req.camera, req.model or next(iter(self.models)), 0.0,
                                    "busy" if busy else "error")
            if exc.code != ErrorCode.SHUTTING_DOWN:  # a reload's refusal, not the feed's
                self.events.refused(req.camera, busy, known, self._counted)
        self.send(identity, refusal(req_id, exc, appended if pushed(req) else None))

    def _refuse_key(self, identity: bytes, exc: ProtocolError, req: Request | None,
                    key: ClientKey | None, req_id: int | None) -> None:
        """`forbidden`: counted against the key (`stats` curve.forbidden, by key name; a
        revoked key's in curve.dropped), logged with the camera it named as `named_camera`,
        never as `camera`: another key's requests cannot turn a camera's feed `refused`."""
        if key is not None and self.curve is not None:
            self.forbidden_by_key[key.name] = self.forbidden_by_key.get(key.name, 0) + 1
        self.errors.report(exc.code.value, client_key=key.name if key else None,
                           named_camera=getattr(req, "camera", None), message=exc.message)
        self.send(identity, refusal(req_id, exc, False if pushed(req) else None))

    def _control(self, identity: bytes, req: Request, key: ClientKey | None) -> None:
        """ping, hello, stats, reset: answered at once."""
        op = req.op
        if req.model is not None and op in ("ping", "hello", "stats"):
            # These answer for the whole daemon, but a name it does not serve is the
            # client's mistake all the same: said at once, not at its first infer.
            model_for(req, self.models)
        if op == "ping":
            self.send(identity, encode_reply(req.id, {"pong": True, "server_time": time.time()}))
            return
        if op == "hello":
            default = next(iter(self.models))
            self.send(identity, encode_reply(req.id, {
                "server": __version__, "protocol": 1, "camera": req.camera,
                "models": [m.describe(name == default) for name, m in self.models.items()]}))
            return
        if op == "stats":
            stats = self.stats()
            if key is not None and key.cameras:  # a camera's key sees its own cameras only
                for part in ("cameras", "feeds"):
                    stats[part] = {c: s for c, s in stats.get(part, {}).items()
                                   if c in key.cameras}
            self.send(identity, encode_reply(req.id, stats))
            return
        if op == "reset":
            # No model named: every model's push state of this camera (as protocol.md says).
            names = [model_for(req, self.models).name] if req.model is not None \
                else list(self.models)
            cam = self.cameras.cameras.get(req.camera)
            if cam is not None:
                if cam.ts is not None:
                    self.events.forget(cam.name, "reset")  # its clock starts over
                cam.reset(names)
            self.send(identity, encode_reply(req.id, {"reset": names}))

    def _stream(self, identity: bytes, req: Request, received: float, peer: str) -> None:
        """An infer or push: admitted, then answered or queued (its frame kept, for a push)."""
        op = req.op
        admitted = admit(req, peer, received, self.models, self.cameras)
        cam, model = admitted.camera, admitted.model
        if admitted.evicted is not None:
            ev = admitted.evicted
            self.errors.report("camera-evicted", event="camera_evicted", camera=ev.camera,
                               peer=ev.peer, idle_s=ev.idle_s, rule=ev.rule, by=req.camera)
            self.events.forget(ev.camera, "camera-evicted")  # its open events end now
        cam.requests += 1
        deadline = None if req.timeout_ms is None else received + req.timeout_ms / 1e3
        ts = timestamp(req, cam)
        if op == "infer":
            self._infer(identity, req, cam, model, received, deadline, ts)
        else:
            self._counted = True
            self.events.frame(cam.name, req.arrays[0])  # the frame is kept even when busy
            self._push(identity, req, cam, model, received, deadline, ts)

    def _infer(self, identity: bytes, req: Request, cam: CameraState, model: ServedModel,
               received: float, deadline: float | None, ts: float | None) -> None:
        window = req.arrays[0]
        key = ("infer", model.name)
        rec = cam.sent.get(key)
        # A resend: the same id and the same window (a reused id with another is a new request).
        fresh = rec is None or rec.req_id != req.id or rec.window is None or \
            not np.array_equal(rec.window, window)
        if fresh:
            rec = cam.sent[key] = Sent(req.id, {}, window=window)
        assert rec is not None
        self._answer(identity, req, cam, model, rec, received, deadline, ts)
        if fresh:
            self._counted = True
            self.events.frame(cam.name, window)  # a window refused busy is no frame seen

    def _push(self, identity: bytes, req: Request, cam: CameraState, model: ServedModel,
              received: float, deadline: float | None, ts: float | None) -> None:
        key = ("push", model.name)
        rec = cam.sent.get(key)
        if rec is None or rec.req_id != req.id:  # a resend's frame is never appended twice
            rec = cam.sent[key] = self._append(req, cam, model)
        try:
            self._answer(identity, req, cam, model, rec, received, deadline, ts)
        except ProtocolError as exc:
            # Past admission, the frame is in the window (appended now, or by the attempt
            # this one resends): only its prediction was refused; a resend runs its window.
            self._reject(identity, exc, req, appended=True)

    def _append(self, req: Request, cam: CameraState, model: ServedModel) -> Sent:
        """A push's frame into its camera's window; its record: the reply, when no prediction
        is due, else the window to predict on (a copy: later frames do not change it)."""
        ring = cam.ring(model.name, model.input_shape, model.config.stride)
        due = ring.append(req.arrays[0])
        extra = {"model": model.name, "ready": due, "frames": ring.buffered,
                 "seq": ring.received}
        if not due:
            return Sent(req.id, extra, reply=encode_reply(req.id, extra))
        return Sent(req.id, extra, window=ring.window())

    def _answer(self, identity: bytes, req: Request, cam: CameraState, model: ServedModel,
                rec: Sent, received: float, deadline: float | None, ts: float | None) -> None:
        """An infer or push answered from its record, a first attempt and a resend (the same
        id, a client's retry) alike, so that a resend never makes a second prediction
        (cameras.Sent): its kept reply, or its prediction queued or running (its answer goes
        here too), or its window run now (a first attempt, or after busy or expired)."""
        if rec.reply is not None:
            self.send(identity, rec.reply)
        elif rec.job is not None:  # queued or running: its answer goes here too
            waiting = [*rec.waiting, identity]
            for given_up in waiting[:-MAX_WAITING]:  # the oldest resend gets no answer:
                self.connections.answered(given_up)  # its connection waits for none
            rec.waiting = waiting[-MAX_WAITING:]
            rec.job.deadline = deadline  # the first attempt's client has given up on it
        elif rec.window is not None:
            rec.job = self._submit(identity, req, cam, model, rec.window, rec.extra, received,
                                   deadline, ts)

    def _submit(self, identity: bytes, req: Request, cam: CameraState, model: ServedModel,
                window: Any, extra: dict[str, Any], received: float,
                deadline: float | None, ts: float | None) -> Job:
        """Queue the prediction, or refuse it: the one place a camera's queue limit is met
        (for a push, once its frame made one due; the frame is kept either way)."""
        job = Job(identity, req.id, cam.name, model.name, req.op, window, cam.lane, received,
                  deadline, extra, ts)
        scheduler = model.scheduler
        if not scheduler.submit(job):
            if scheduler.closed:  # a reload replaces the model (the daemon's own stop
                # refuses requests before they are read: refuse_all)
                raise ProtocolError(ErrorCode.SHUTTING_DOWN, "this model is being replaced; "
                                    "retry in a moment", req.id, Reason.MODEL_REPLACED)
            raise ProtocolError(ErrorCode.BUSY, (
                f"camera {cam.name!r} already has {scheduler.queue_size} requests queued; "
                "slow down or raise [server] queue_size"), req.id, Reason.QUEUE_FULL)
        cam.in_flight += 1
        return job

    # -- replies ---------------------------------------------------------------------------
    def complete(self, reply: Reply, now: float) -> None:
        """Settle a finished job's bookkeeping, hand its prediction to the events, then send
        its reply (to every attempt waiting for it). Never raises: a bug met on the way is
        this camera's (`fault`), answered `internal`, and the batch's other replies and the
        loop go on."""
        job = reply.job
        waiting: Sequence[bytes] = ()
        try:
            cam = self.cameras.cameras.get(job.camera)
            rec = None
            if cam is not None:
                cam.in_flight -= 1
                rec = cam.sent.get((job.op, job.model))
                if rec is not None and rec.job is job:
                    rec.job, waiting, rec.waiting = None, rec.waiting, ()
                else:
                    rec = None
            frames = self._settle(job, reply, cam, now)
            if rec is not None and reply.outcome == "ok":
                rec.reply = frames  # a resend's answer: its prediction is in the events
        except Exception as exc:
            frames = self.fault(job.req_id, job.camera, exc, "prediction")
        self.send(job.identity, frames)
        for identity in waiting:  # resends of it, answered alike
            self.send(identity, frames)

    def _settle(self, job: Job, reply: Reply, cam: CameraState | None, now: float
                ) -> list[bytes]:
        """A finished job's reply, its camera served, its latency recorded, its prediction
        judged by the events, which are said before the reply goes: a fault in them is
        still this request's to answer `internal`."""
        frames = encode_reply(job.req_id, reply.result, error=reply.error)
        if cam is not None and reply.outcome == "ok" and not cam.served:
            self.cameras.mark_served(cam)  # its slot is out of invented ids' reach
        self._record(job, reply, cam is not None)
        self.events.observe(reply, now)
        return frames

    def fault(self, req_id: int | None, camera: str | None, exc: Exception, where: str
              ) -> list[bytes]:
        """A daemon bug met for one camera (`where`: its request, or its prediction and
        events): counted; the camera's events reset (its open ones end, reason internal),
        so that the bug's harm is that camera's state, never the loop's; one error line
        (rate-limited: ClientErrorLog). The `internal` reply its request gets."""
        self.counters["errors"] += 1
        ended: int | str = 0
        if camera is not None:
            try:
                ended = self.events.forget(camera, "internal")
            except Exception as again:  # its tracks are gone all the same (Events.forget)
                ended = f"unsaid ({type(again).__name__}: {again})"
        self.errors.report("internal", event="request_crashed", camera=camera, fault=True,
                           where=where, error=f"{type(exc).__name__}: {exc}",
                           events_ended=ended, traceback=traceback.format_exc(limit=8))
        return encode_reply(req_id, error=(ErrorCode.INTERNAL.value,
                                           f"internal error: {type(exc).__name__}: {exc}"))

    def _record(self, job: Job, reply: Reply, in_table: bool) -> None:
        """Count and time a finished job; `in_table`: its camera is in the table (latency is
        kept for those only: bounded)."""
        outcome = reply.outcome
        if outcome != "ok":
            if outcome == "expired":
                self.counters["expired"] += 1
            else:
                self.counters["errors"] += 1
                outcome = "error"
        t = reply.timings
        total_ms = t.get("total_ms")
        if total_ms is None:
            total_ms = (time.monotonic() - job.received) * 1e3
        if in_table:
            self.latency.record(job.camera, job.model, total_ms, outcome, t, LATENCY_STAGES)
        # Per request, at debug level only (`--log-level debug`): exact percentiles for
        # `stgcnd logs summarize`; free when the level filters it out.
        if self.log_requests:
            log.debug("request", camera=job.camera, model=job.model, request_id=job.req_id,
                      outcome=outcome, total_ms=round(total_ms, 3),
                      **{k: v for k, v in t.items() if k != "total_ms"})

    def send(self, identity: bytes, frames: list[bytes]) -> bool:
        """Send without ever blocking the loop; False when the reply was dropped."""
        self.connections.answered(identity)  # sent or dropped, its connection waits no more
        router = self.router
        try:
            # Frame by frame with plain-int flags, past pyzmq's Python wrapper (send_multipart
            # is a loop over it): 7k instructions a reply instead of 11k. Only the first
            # frame can be refused (routing); once it is queued the rest always is.
            send_frame(router, identity, NOBLOCK_MORE)
            if len(frames) == 1:  # every reply: one header frame
                send_frame(router, frames[0], NOBLOCK)
                return True
            last = len(frames) - 1
            for i, frame in enumerate(frames):
                send_frame(router, frame, NOBLOCK if i == last else NOBLOCK_MORE)
            return True
        except zmq.Again:
            # The client's queue is full: it sends and does not read. Blocking here would
            # freeze every camera; its reply is dropped instead.
            reason = "client is not reading its replies (its queue is full)"
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the client is gone
            reason = f"client gone ({exc.strerror})"
        self.counters["replies_dropped"] += 1
        self.trim_due = True
        self.errors.report("reply-dropped", event="reply_dropped", reason=reason)
        return False

    def camera_stats(self) -> dict[str, dict[str, int]]:
        return {c: {"requests": s.requests, "in_flight": s.in_flight, "lane": s.lane}
                for c, s in self.cameras.cameras.items()}

    def process_stats(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "process_cpu_s": round(time.process_time(), 6),
                "camera_evictions": self.cameras.evictions,
                "camera_churn_refused": self.cameras.churn_refused,
                "connections": self.connections.stats(),
                "oversized_messages": self.receiver.oversized_messages,
                **({"curve": {"denied": self.curve.refusals.count, "dropped": self.curve.dropped,
                              "forbidden": dict(self.forbidden_by_key),
                              "clients": len(self.curve.keys)}} if self.curve else {})}


def pushed(req: Request | None) -> bool:
    return req is not None and req.op == "push"


def refusal(req_id: int | None, exc: ProtocolError, appended: bool | None) -> list[bytes]:
    """A refused request's reply: its error and, for a push, whether its frame was `appended`
    (docs/protocol.md §3; None: not a push). The exception says what was refused, the path
    that refused it what became of the frame: nothing is written on the exception."""
    if appended is None:
        return encode_reply(req_id, error=exc)
    return encode_reply(req_id, error=ErrorInfo(exc.code.value, exc.message, reason=exc.reason,
                                                appended=appended))


def forbidden(key: ClientKey, camera: str) -> str:
    return (f"camera {camera!r} is not one of this client's key ({key.name}): it may use "
            f"{', '.join(key.cameras)}; use one of those ids, or bind the key to more cameras "
            "(`stgcnd keys create NAME --cameras ...`)")


def timestamp(req: Request, cam: CameraState) -> float | None:
    """The request's `ts`, checked against its camera's clock: never back in time, and a
    camera is on its own clock (ts on every infer and push) or on the daemon's (none)."""
    ts = req.fields.get("ts")
    if ts is None:
        if cam.ts is not None:
            raise ProtocolError(ErrorCode.MALFORMED, f"camera {cam.name!r} sent \"ts\" before: "
                                "send it with every infer and push, or send reset first",
                                req.id)
        cam.untimed = True
        return None
    if type(ts) not in (int, float) or not -MAX_TS_S < ts < MAX_TS_S:  # NaN fails it too
        raise ProtocolError(ErrorCode.MALFORMED, f'"ts" must be a number of seconds above '
                            f"-1e11 and below 1e11 (Unix time, or a recording's own time) or "
                            f"nil, got {ts!r}", req.id)
    if cam.untimed:
        raise ProtocolError(ErrorCode.MALFORMED, f"camera {cam.name!r} sent infer or push "
                            "without \"ts\": a camera id is on one clock; send ts from its "
                            "first request, or use a new camera id", req.id)
    if cam.ts is not None and ts < cam.ts:
        raise ProtocolError(ErrorCode.MALFORMED, f'"ts" {ts} is before camera {cam.name!r}\'s '
                            f"last, {cam.ts}: a camera's frames go forward in time; send reset "
                            "when its stream starts over", req.id)
    cam.ts = float(ts)
    return cam.ts


def request_id(header: Any, limits: Limits) -> int | None:
    """The id of a request whose header may be all that can be read of it."""
    try:
        return decode_request([header], limits).id
    except ProtocolError as exc:
        return exc.req_id
    except Exception:
        return None
