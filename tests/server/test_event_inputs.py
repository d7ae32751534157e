"""What reaches the events (issue #34): a retried request (the same id) is one prediction, so
one input to the events, whether its first attempt is answered, queued or running; and a
camera that sends its frames' times (`ts`) has its events timed by them, not by when a loaded
daemon got round to the windows. A real daemon, real sockets, the noop model (P = 0.5)."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from stgcnd.server.cameras import CameraState
from stgcnd.server.config import EventsConfig
from stgcnd.server.events import Events
from stgcnd_client import Client, ServerError
from stgcnd_client.wire import decode_reply, encode_request
from tests.server.daemon_harness import Daemon, stop_by_pid
from tests.server.test_event_trust import LABELS, window
from tests.server.test_events import NOOP_EVENTS

# k-of-n with k = n = 3: a start needs three predictions, whatever the time between them.
THREE_WINDOWS = NOOP_EVENTS.format(exit=0.4) + 'smoothing = "k-of-n"\nk = 3\nn = 3\n'
FIVE_SECONDS = NOOP_EVENTS.format(exit=0.4).replace("min_duration_s = 0.0",
                                                    "min_duration_s = 5.0")
SEEN, NOBODY = window(0.9, frames=30), window(0.0, frames=30)
T0 = 1_700_000_000.0   # Unix time, as a camera's capture clock gives it


def send(sock: zmq.Socket, op: str, req_id: int, camera: str, array: np.ndarray) -> None:
    sock.send_multipart(encode_request(op, req_id, camera, arrays=[array]))


def answer(sock: zmq.Socket) -> list[bytes]:
    assert sock.poll(30_000), "no reply"
    frames = sock.recv_multipart()
    assert decode_reply(frames).ok, decode_reply(frames)
    return frames


def dealer(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def action_events(d: Daemon) -> list[dict]:
    return [e for e in d.log_events() if e.get("event") == "action_event"]


def test_a_retried_request_is_one_input_to_the_events(tmp_path):
    """The integrator's finding: a retried infer reached the event logic once per attempt.
    Three attempts of one window (each on a fresh socket, as the client's retries) and one
    more window are two predictions: no start, where three distinct windows start one. A
    resend sent while the first is still queued is answered by that one prediction too
    (infer and push alike); every attempt gets the same reply, byte for byte."""
    d = Daemon(tmp_path, models=THREE_WINDOWS)
    d.start()
    ctx = zmq.Context()
    try:
        replies = []
        for _ in range(3):
            with dealer(ctx, d.endpoint) as sock:
                send(sock, "infer", 1, "resent", SEEN)
                replies.append(answer(sock))
        assert replies[0] == replies[1] == replies[2]
        with dealer(ctx, d.endpoint) as sock:
            send(sock, "infer", 2, "resent", SEEN)
            answer(sock)
            for req_id in (1, 2):                       # sent before the first is answered
                send(sock, "infer", req_id, "queued", SEEN)
                send(sock, "infer", req_id, "queued", SEEN)
                assert answer(sock) == answer(sock)
            for req_id in range(1, 31):                 # the 30th frame makes one due
                send(sock, "push", req_id, "pushed", SEEN[:, 0])
                if req_id == 30:
                    send(sock, "push", req_id, "pushed", SEEN[:, 0])
                    assert answer(sock) == answer(sock)
                else:
                    answer(sock)
            send(sock, "push", 31, "pushed", SEEN[:, 0])
            answer(sock)
            for req_id in (1, 2, 3):
                send(sock, "infer", req_id, "distinct", SEEN)
                answer(sock)
        assert d.stop() == 0
    finally:
        ctx.destroy(0)
        stop_by_pid(d)
    assert [(e["camera"], e["kind"]) for e in action_events(d)] == [
        ("distinct", "start"), ("distinct", "end")]


def test_a_reused_id_with_another_window_is_a_new_infer(tmp_path):
    d = Daemon(tmp_path, models=THREE_WINDOWS)
    d.start()
    ctx = zmq.Context()
    try:
        with dealer(ctx, d.endpoint) as sock:
            for shift in (0.0, 0.01, 0.02):             # a client restarted its counter
                w = SEEN.copy()
                w[0] += shift
                send(sock, "infer", 1, "reused", w)
                answer(sock)
        assert d.stop() == 0
    finally:
        ctx.destroy(0)
        stop_by_pid(d)
    assert [e["kind"] for e in action_events(d)] == ["start", "end"]


def test_events_run_on_the_frames_times_when_the_client_sends_them(tmp_path):
    """Ten windows sent in a moment but ten seconds apart in video time start an event with
    min_duration_s 5; sent without times, they do not (the daemon saw a moment). The end and
    its duration are in video time too. A time that goes back is refused with the fix, as is
    a camera mixing clocks; a reset starts the camera's clock over."""
    d = Daemon(tmp_path, models=FIVE_SECONDS)
    d.start()
    try:
        with Client(d.endpoint, camera_id="video") as video, \
                Client(d.endpoint, camera_id="live") as live:
            for i in range(10):
                video.infer(SEEN, timestamp=T0 + i)
                live.infer(SEEN)
            for i in (10, 11, 12):                      # nobody in view: the exit hold runs
                video.infer(NOBODY, timestamp=T0 + i)
            with pytest.raises(ServerError, match=r"before camera 'video'.s last.*reset"):
                video.infer(SEEN, timestamp=T0 + 11)
            with pytest.raises(ServerError, match="every infer and push, or send reset"):
                video.infer(SEEN)
            with pytest.raises(ServerError, match="on one clock"):
                live.infer(SEEN, timestamp=T0)
            with pytest.raises(ServerError, match="above -1e11 and below 1e11"):
                video.infer(SEEN, timestamp=float("nan"))
            video.reset()
            video.infer(SEEN, timestamp=0.0)            # a recording's own time, from 0
        assert d.stop() == 0
    finally:
        stop_by_pid(d)
    start, end = action_events(d)
    assert (start["camera"], start["kind"], end["kind"]) == ("video", "start", "end")
    assert (start["started"], start["at"]) == (T0, T0 + 5)
    assert (end["reason"], end["ended"], end["duration_s"]) == ("no-person", T0 + 10, 10.0)


def test_a_timed_camera_s_silent_end_and_cooldown_are_on_its_clock():
    """The daemon decides a silent camera's end without a prediction: on the camera's clock,
    its last prediction's time plus the daemon's time since; so is its cooldown."""
    events = Events()
    events.configure({"m": (EventsConfig(min_duration_s=0.0, cooldown_s=10.0), LABELS)},
                     now=100.0, wall=1100.0)
    (start,) = events.observe("cam", "m", [0.05, 0.95], now=7.0, wall=7.0, heard=100.0)
    assert start["started"] == 7.0
    table = {"cam": CameraState("cam", 0, last_activity=100.0)}
    (end,) = events.expire_silent(now=106.0, wall=1106.0, cameras=table)
    assert (end["reason"], end["ended"], end["at"]) == ("camera-silent", 7.0, 13.0)
    # Back at video time 20 (cooldown until 13 + 10): none yet; at 23 a new start.
    assert events.observe("cam", "m", [0.05, 0.95], now=20.0, wall=20.0, heard=120.0) == []
    (again,) = events.observe("cam", "m", [0.05, 0.95], now=23.0, wall=23.0, heard=123.0)
    assert again["started"] == 23.0
