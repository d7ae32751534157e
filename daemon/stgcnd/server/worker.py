"""One worker thread per connected camera: its queue, its backend sessions, its ring buffers.

A camera's requests run in arrival order on its own thread with its own sessions (own CUDA
stream and execution context), so a slow or stuck camera only ever delays itself. The worker
never touches the ROUTER socket (ZeroMQ sockets are single-threaded): it sends each reply,
prefixed with the client's routing identity, through its own PUSH socket to the main loop.
Liveness: `heartbeat` is a monotonic timestamp refreshed whenever the worker is not inside an
inference; `busy_since` is set while it is. The main loop's watchdog trusts only these.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from stgcnd.log import get_logger
from stgcnd.server.models import ServedModel, softmax
from stgcnd.server.ring import FrameRing
from stgcnd_client.protocol import ErrorCode, ProtocolError, Request, encode_reply

log = get_logger(__name__)

REPLY_ENDPOINT = "inproc://stgcnd-replies"


@dataclass
class Work:
    identity: bytes
    request: Request
    model: str                  # resolved model name
    received: float             # monotonic seconds
    deadline: float | None      # monotonic seconds


class FatalDeviceError(RuntimeError):
    """The GPU is in an unrecoverable state: the process must exit and be restarted."""


def is_fatal(exc: BaseException) -> bool:
    mod = type(exc).__module__ or ""
    text = str(exc)
    return mod.startswith("pycuda") or "CUDA error" in text or "cudaError" in text \
        or "illegal memory access" in text


class CameraWorker(threading.Thread):
    def __init__(self, camera: str, ctx: zmq.Context, models: Callable[[], dict[str, ServedModel]],
                 queue_size: int, record: Callable[..., None],
                 on_fatal: Callable[[BaseException], None]) -> None:
        super().__init__(name=f"camera-{camera}", daemon=True)
        self.camera = camera
        self._ctx = ctx
        self._models = models
        self._queue: queue.Queue[Work | None] = queue.Queue(maxsize=queue_size)
        self._record = record
        self._on_fatal = on_fatal
        self.heartbeat = time.monotonic()
        self.busy_since: float | None = None
        self.last_activity = time.monotonic()
        self.drain_deadline: float | None = None  # set at shutdown
        self.requests = 0
        self._sessions: dict[str, tuple[ServedModel, Any]] = {}
        self._rings: dict[str, FrameRing] = {}
        self._last_push: dict[str, tuple[int, list[bytes]]] = {}
        self._timings: dict[str, float] = {}  # the current request's stage timings

    # -- called from the main thread -------------------------------------------------------
    def submit(self, work: Work) -> bool:
        """Queue work; False (answer busy) when this camera's queue is full."""
        try:
            self._queue.put_nowait(work)
        except queue.Full:
            return False
        self.last_activity = time.monotonic()
        return True

    def stop(self) -> None:
        """Finish what is queued, then exit (the sentinel waits behind queued work)."""
        while True:
            try:
                self._queue.put(None, timeout=0.1)
                return
            except queue.Full:
                if not self.is_alive():
                    return

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    # -- the worker thread -----------------------------------------------------------------
    def run(self) -> None:
        out = self._ctx.socket(zmq.PUSH)
        out.setsockopt(zmq.LINGER, 1000)
        out.connect(REPLY_ENDPOINT)
        try:
            while True:
                self.heartbeat = time.monotonic()
                try:
                    work = self._queue.get(timeout=0.5)
                except queue.Empty:
                    self._release_retired()
                    continue
                if work is None:
                    break
                frames = self._handle(work)
                out.send_multipart([work.identity, *frames], copy=False)
        finally:
            for model, session in self._sessions.values():
                model.release_session(session)
            self._sessions.clear()
            out.close()

    def _release_retired(self) -> None:
        current = self._models()
        for name, (model, session) in list(self._sessions.items()):
            if current.get(name) is not model:
                del self._sessions[name]
                model.release_session(session)

    def _session(self, model: ServedModel) -> Any:
        held = self._sessions.get(model.name)
        if held is not None and held[0] is model:
            return held[1]
        if held is not None:  # the model was reloaded: move to the new backend
            held[0].release_session(held[1])
        session = model.open_session()
        self._sessions[model.name] = (model, session)
        return session

    def _handle(self, work: Work) -> list[bytes]:
        req = work.request
        now = time.monotonic()
        queue_ms = (now - work.received) * 1e3
        outcome = "error"
        ran = True  # False for push replies that only buffered a frame: no latency to record
        try:
            if self.drain_deadline is not None and now > self.drain_deadline:
                raise ProtocolError(ErrorCode.SHUTTING_DOWN,
                                    "the daemon is shutting down; retry on its restart", req.id)
            model = self._models().get(work.model)
            if model is None:
                raise ProtocolError(ErrorCode.UNKNOWN_MODEL,
                                    f"model {work.model!r} was removed by a reload", req.id)
            if req.op == "reset":
                self._rings.pop(model.name, None)
                self._last_push.pop(model.name, None)
                reply = encode_reply(req.id, {"reset": [model.name]})
            elif req.op == "push":
                reply, ran = self._push(work, model, queue_ms)
            else:
                reply = encode_reply(req.id, self._infer(work, model, req.arrays[0], queue_ms))
            outcome = "ok"  # failures leave through the except clauses below
            return reply
        except ProtocolError as exc:
            if exc.code == ErrorCode.EXPIRED:
                outcome = "expired"
            return encode_reply(req.id, error=(exc.code.value, exc.message))
        except Exception as exc:
            log.error("request_error", camera=self.camera, model=work.model, id=req.id,
                      error=f"{type(exc).__name__}: {exc}")
            if is_fatal(exc):
                self._on_fatal(exc)
            return encode_reply(req.id, error=(ErrorCode.INTERNAL.value,
                                               f"inference failed: {type(exc).__name__}: {exc}"))
        finally:
            self.requests += 1
            self.last_activity = time.monotonic()
            total_ms = (time.monotonic() - work.received) * 1e3
            if req.op in ("infer", "push") and ran:
                self._record(self.camera, work.model, total_ms, outcome)
                # Per request, at debug level only (`--log-level debug`): exact percentiles
                # for `stgcnd logs summarize`; free when the level filters it out.
                log.debug("request", camera=self.camera, model=work.model, request_id=req.id,
                          outcome=outcome, total_ms=round(total_ms, 3), **self._timings)
            self._timings = {}

    def _infer(self, work: Work, model: ServedModel, window: np.ndarray, queue_ms: float
               ) -> dict[str, Any]:
        if work.deadline is not None:
            # Answer expired without running when even a typical run would end too late.
            eta = time.monotonic() + model.compute_ms_ewma / 1e3
            if eta > work.deadline:
                raise ProtocolError(ErrorCode.EXPIRED,
                                    f"deadline passed after {queue_ms:.1f} ms in queue; a run "
                                    f"takes ~{model.compute_ms_ewma:.1f} ms", work.request.id)
        session = self._session(model)
        self.busy_since = time.monotonic()
        try:
            logits = session.infer(window[None])[0]
        finally:
            self.busy_since = None
            self.heartbeat = time.monotonic()
        timings = dict(session.last_timings)
        compute_ms = timings.get("total_ms", 0.0)
        model.observe_compute(compute_ms)
        probs = softmax(logits.astype(np.float64))
        label = int(np.argmax(logits))
        timings = {**{k: round(v, 3) for k, v in timings.items() if k != "total_ms"},
                   "queue_ms": round(queue_ms, 3), "compute_ms": round(compute_ms, 3)}
        self._timings = timings
        timings = {**timings, "total_ms": round((time.monotonic() - work.received) * 1e3, 3)}
        return {"model": model.name, "logits": logits.astype(float).tolist(),
                "probs": probs.tolist(), "label": label, "label_name": model.labels[label],
                "timings": timings}

    def _push(self, work: Work, model: ServedModel, queue_ms: float
              ) -> tuple[list[bytes], bool]:
        """(reply frames, whether an inference ran)."""
        req = work.request
        last = self._last_push.get(model.name)
        if last is not None and last[0] == req.id:
            return last[1], False  # a resend after a client timeout: do not append twice
        ring = self._rings.get(model.name)
        if ring is None or ring.frames != model.input_shape[1]:
            ring = self._rings[model.name] = FrameRing(model.input_shape, model.config.stride)
        due = ring.append(req.arrays[0])
        result: dict[str, Any] = {"model": model.name, "ready": due, "frames": ring.buffered,
                                  "seq": ring.received}
        if due:
            result.update(self._infer(work, model, ring.window(), queue_ms))
        frames = encode_reply(req.id, result)
        self._last_push[model.name] = (req.id, frames)
        return frames, due
