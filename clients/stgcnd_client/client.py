"""The stgcnd client: one DEALER socket per camera thread, Lazy Pirate retries within a deadline.

A Client is not thread-safe, by design (ZeroMQ sockets must not be shared): a call from a
thread other than its owner raises `CrossThreadUse`. A call's `timeout` is how long the caller
waits, whatever the attempts; the retry rules are described above `Client`.
"""

from __future__ import annotations

import itertools
import math
import os
import socket as _socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import zmq

from .curve import ClientKey, KeySource, curve_options, unreachable_hint
from .endpoint import parse_endpoint
from .errors import (
    BadReply,
    ClientClosed,
    CrossThreadUse,
    Expired,
    Timeout,
    server_error,
)
from .payload import as_frame, as_window
from .protocol import ErrorCode, Op, ProtocolError
from .results import Result, ServerInfo
from .wire import Reply, decode_reply, encode_request

# An attempt shorter than this cannot tell a slow server from a lost message, so short deadlines
# get fewer, longer attempts instead of many tiny ones.
MIN_ATTEMPT_S = 0.25

_camera_counter = itertools.count(1)


# Reliability (the "Lazy Pirate" pattern): after sending, the client polls for the reply. When an
# attempt's share of the deadline passes with no reply, the socket is closed (dropping whatever it
# still queues), a fresh DEALER connects and the same request (same id) is sent again, as long as
# the caller's overall deadline and the retry budget allow. Each attempt tells the daemon its own
# wait as the request's deadline (`timeout_ms` on the wire), so an abandoned attempt expires there
# instead of running. An `expired` answer to an attempt that had only a share of the time left is
# not the end of the call: the daemon is evidently there, what the attempt lacked was time, so the
# same request goes again at once, on the same socket, with everything that is left (whatever
# `retries` says). Only `expired` to an attempt that had all the time left is raised (`Expired`).
# Replies that do not carry the outstanding request's id are discarded.
class Client:
    """Talks to one stgcnd daemon for one camera.

    >>> with Client("ipc:///run/stgcnd/stgcnd.sock", camera_id="aisle-3") as client:
    ...     result = client.infer(window)          # window: (3, T, V, M) float32
    ...     print(result.label_name, result.probs)

    ``timeout`` (seconds, default 5) is how long a call waits in all, whatever its attempts;
    a call's own ``timeout=`` overrides it. ``retries`` is how many times a request is resent
    on a fresh socket after a reply did not come within its attempt's share of the time
    (``Timeout`` when none came at all); an ``expired`` answer with time left is retried at
    once with all of it (``Expired`` when even that was too little).

    A daemon on another machine (tcp with CURVE) also needs ``server_key`` (its public key)
    and ``client_key`` (this camera's pair), as files or z85 text: see stgcnd_client.curve.
    """

    def __init__(
        self,
        endpoint: str,
        camera_id: str | None = None,
        *,
        timeout: float = 5.0,
        retries: int = 3,
        context: zmq.Context | None = None,
        hwm: int = 64,
        max_reply_bytes: int = 16 * 1024 * 1024,
        server_key: KeySource | None = None,
        client_key: ClientKey | None = None,
    ) -> None:
        parse_endpoint(endpoint)  # a wrong endpoint fails here, not as a ZMQError later
        timeout = _checked_timeout(timeout)
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.endpoint = endpoint
        self._curve = curve_options(server_key, client_key)  # bad keys fail here, not later
        self.camera_id = camera_id or (
            f"{_socket.gethostname()}-{os.getpid()}-{next(_camera_counter)}"
        )
        self.timeout = float(timeout)
        self.retries = int(retries)
        # Counts fresh sockets made after a lost reply; useful for a camera's health metrics.
        self.reconnects = 0
        self._lost_reply = False
        self._context = context if context is not None else zmq.Context.instance()
        self._hwm = hwm
        self._max_reply_bytes = max_reply_bytes
        self._socket: zmq.Socket | None = None
        self._ids = itertools.count(1)
        self._owner: int | None = None
        self._guard = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ public API

    def hello(self, timeout: float | None = None) -> ServerInfo:
        """Introduce this camera; returns the server version and the models it serves."""
        result, _ = self._call(Op.HELLO, timeout=timeout)
        return ServerInfo.from_result(result)

    def infer(
        self, window: Any, model: str | None = None, timeout: float | None = None,
        timestamp: float | None = None,
    ) -> Result:
        """Classify one full window (3, T, V, M), float32 or float16.

        ``timestamp``: the capture time of the window's last frame, in seconds (Unix time, or
        a recording's time); the camera's events then run on it (docs/protocol.md, ``ts``).
        """
        array = as_window(window)
        result, client_ms = self._call(Op.INFER, model=model, arrays=(array,), timeout=timeout,
                                       **_ts(timestamp))
        return Result.from_result(result, client_ms)

    def push(
        self, frame: Any, model: str | None = None, timeout: float | None = None,
        timestamp: float | None = None,
    ) -> Result | None:
        """Append one frame (3, V, M) to this camera's window on the server.

        Returns None until the server's window is full, then a Result every ``stride`` frames.
        ``timestamp``: the frame's capture time, as for `infer`.
        """
        array = as_frame(frame)
        result, client_ms = self._call(Op.PUSH, model=model, arrays=(array,), timeout=timeout,
                                       **_ts(timestamp))
        if not result.get("ready"):
            return None
        return Result.from_result(result, client_ms)

    def reset(self, model: str | None = None, timeout: float | None = None) -> list[str]:
        """Clear this camera's push buffers (one model, or all); returns the models reset."""
        result, _ = self._call(Op.RESET, model=model, timeout=timeout)
        return [str(name) for name in result.get("reset", [])]

    def ping(self, timeout: float | None = None) -> float:
        """Round trip to the server in milliseconds."""
        _, client_ms = self._call(Op.PING, timeout=timeout)
        return client_ms

    def stats(self, timeout: float | None = None) -> dict[str, Any]:
        """The server's statistics map (its content is the server's business)."""
        result, _ = self._call(Op.STATS, timeout=timeout)
        return result

    def close(self) -> None:
        """Close the socket. Idempotent; the shared ZeroMQ context is left alone."""
        if not self._guard.acquire(blocking=False):
            raise CrossThreadUse(
                "close() was called while another thread is inside a call on this Client; "
                "stop the camera thread first, or close from that thread"
            )
        try:
            self._closed = True
            self._drop_socket()
        finally:
            self._guard.release()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"Client({self.endpoint!r}, camera_id={self.camera_id!r}, {state})"

    # ------------------------------------------------------------------ request/reply

    def _call(
        self,
        op: Op,
        model: str | None = None,
        arrays: tuple[np.ndarray, ...] = (),
        timeout: float | None = None,
        **fields: Any,
    ) -> tuple[dict[str, Any], float]:
        with self._exclusive():
            budget = self.timeout if timeout is None else _checked_timeout(timeout)
            start = time.monotonic()
            deadline = start + budget
            req_id = next(self._ids)
            attempts = self.retries + 1
            connected = False
            made = 0
            for attempt in range(attempts):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                wait = max(remaining / (attempts - attempt), min(remaining, MIN_ATTEMPT_S))
                made += 1
                sent, reply = self._attempt(op, req_id, model, arrays, fields, wait)
                connected = connected or sent
                if reply is not None and _is_expired(reply) and wait < remaining:
                    # The daemon is there and answering; what the attempt lacked was time, its
                    # share of the budget being kept for resends after a lost reply. One more
                    # attempt, on this socket, with everything that is left: the caller's
                    # timeout is what the caller waits, whatever the attempts.
                    left = deadline - time.monotonic()
                    if left > 0:
                        made += 1
                        wait = left
                        _sent, reply = self._attempt(op, req_id, model, arrays, fields, left)
                if reply is not None:
                    client_ms = (time.monotonic() - start) * 1000.0
                    if not reply.ok:
                        assert reply.error is not None
                        if reply.error.code == ErrorCode.EXPIRED.value:
                            expired = _expired(op, budget, wait, made, reply.error.message)
                            expired.appended = reply.error.appended  # a push's frame is kept
                            raise expired
                        raise server_error(reply.error.code, reply.error.message,
                                           reply.error.reason, reply.error.appended)
                    return reply.result, client_ms
                self._drop_socket()
                self._lost_reply = True
            elapsed = time.monotonic() - start
            if not connected:
                raise Timeout(
                    f"could not reach stgcnd at {self.endpoint} within {elapsed:.2f} s; "
                    + unreachable_hint(self.endpoint, keyed=bool(self._curve))
                )
            raise Timeout(
                f"no reply from stgcnd at {self.endpoint} to {op.value} within {elapsed:.2f} s "
                f"({made} attempt(s)); the daemon may be overloaded or restarting"
            )

    def _attempt(
        self,
        op: Op,
        req_id: int,
        model: str | None,
        arrays: tuple[np.ndarray, ...],
        fields: dict[str, Any],
        wait: float,
    ) -> tuple[bool, Reply | None]:
        """Send the request (same id every attempt) and wait up to `wait` seconds for its
        reply: (whether it was sent, the reply or None)."""
        attempt_deadline = time.monotonic() + wait
        # The server gets this attempt's wait as its deadline: once it passes, nobody reads the
        # reply (this socket is about to be replaced), so the server may as well not run it.
        frames = encode_request(
            op, req_id, self.camera_id, model, arrays, timeout_ms=wait * 1000.0, **fields
        )
        return self._exchange(frames, req_id, attempt_deadline)

    def _exchange(
        self, frames: list[bytes], req_id: int, deadline: float
    ) -> tuple[bool, Reply | None]:
        sock = self._ensure_socket()
        if not self._send(sock, frames, deadline):
            return False, None
        while True:
            ms = _ms_until(deadline)
            if ms <= 0:
                return True, None
            if not sock.poll(ms, zmq.POLLIN):
                continue
            try:
                reply = decode_reply(sock.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                continue
            except ProtocolError as exc:
                if exc.code == ErrorCode.UNSUPPORTED_VERSION:
                    raise BadReply(exc.message) from None
                # Garbage cannot be matched to a request; keep waiting for the real reply.
                continue
            # A nil id is the server saying it could not read our request's id; with one request
            # outstanding per socket it can only be about this one.
            if reply.id == req_id or (reply.id is None and not reply.ok):
                return True, reply
            # Anything else is a late reply to an earlier request: drop it.

    def _send(self, sock: zmq.Socket, frames: list[bytes], deadline: float) -> bool:
        # IMMEDIATE=1 makes send fail (instead of queueing) until a connection exists, so a
        # missing daemon shows up as "not writable" rather than as a silently queued request.
        while True:
            try:
                sock.send_multipart(frames, zmq.NOBLOCK)
                return True
            except zmq.Again:
                ms = _ms_until(deadline)
                if ms <= 0:
                    return False
                sock.poll(min(ms, 50), zmq.POLLOUT)

    def _ensure_socket(self) -> zmq.Socket:
        if self._socket is None:
            sock = self._context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self._hwm)
            sock.setsockopt(zmq.RCVHWM, self._hwm)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.MAXMSGSIZE, self._max_reply_bytes)
            for option, value in self._curve:
                sock.setsockopt(option, value)
            sock.connect(self.endpoint)
            self._socket = sock
            if self._lost_reply:
                self.reconnects += 1
                self._lost_reply = False
        return self._socket

    def _drop_socket(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        me = threading.get_ident()
        if not self._guard.acquire(blocking=False):
            raise CrossThreadUse(
                "this Client is in use by another thread; ZeroMQ sockets are not thread-safe, "
                "so create one Client per camera thread"
            )
        try:
            if self._closed:
                raise ClientClosed(f"{self!r} is closed; create a new Client")
            if self._owner is None:
                self._owner = me
            elif self._owner != me:
                raise CrossThreadUse(
                    f"this Client belongs to thread {self._owner} and was called from thread "
                    f"{me}; ZeroMQ sockets are not thread-safe, so create one Client per "
                    "camera thread"
                )
            yield
        finally:
            self._guard.release()


def _checked_timeout(timeout: float) -> float:
    seconds = float(timeout)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    return seconds


def _ts(timestamp: float | None) -> dict[str, float]:
    """The header's `ts` when one is given (none sent otherwise: the daemon's clocks)."""
    return {} if timestamp is None else {"ts": float(timestamp)}


def _is_expired(reply: Reply) -> bool:
    return not reply.ok and reply.error is not None and reply.error.code == ErrorCode.EXPIRED.value


def _expired(op: Op, budget: float, last_wait: float, attempts: int, why: str) -> Expired:
    """The caller's view of a final `expired`: in its own terms (`timeout`, in seconds)."""
    return Expired(
        ErrorCode.EXPIRED.value,
        f"{op.value} could not be answered within timeout={budget:g} s: the daemon refused "
        f"the last of {attempts} attempt(s), which had {last_wait:.2f} s left, as too late "
        f"({why}); pass a longer timeout (seconds), or lighten the daemon's load",
    )


def _ms_until(deadline: float) -> int:
    # Round up so a positive remainder never turns into a 0 ms (non-blocking) poll.
    remaining = deadline - time.monotonic()
    return 0 if remaining <= 0 else max(1, int(remaining * 1000.0 + 0.999))
