"""Issue #41, item 1: a header value a peer chooses must not reach the I/O loop as a crash, and
a bug met for one camera must not end the loop for every camera. A `ts` no clock can mean
(1e306, 1.7e308, their negatives, or a jump to one after an event started, which the silent
camera sweep met seconds later) overflowed the events' milliseconds and killed the daemon; it
is now refused `malformed` with the range. And a fault in one camera's events (injected in an
in-process Server, its real sockets and loop) is answered `internal`, ends that camera's open
event (reason internal), logs one error line, and every other camera is served on; a fault in
the silent-camera sweep or the stats tick is one error line and the loop goes on."""

from __future__ import annotations

import threading
import time

import pytest
from structlog.testing import capture_logs

from stgcnd.server.config import load_config
from stgcnd.server.notify import Notifier
from stgcnd.server.server import Server
from stgcnd.server.wakeup import Wakeup
from stgcnd_client import Client, ServerError
from tests.server.daemon_harness import Daemon, stop_by_pid, write_config
from tests.server.test_event_inputs import SEEN, T0, action_events
from tests.server.test_events import NOOP_EVENTS

# P(shoplifting) = 0.5 on every window of the noop model: its first prediction starts an
# event; a camera silent for a second has it ended by the sweep.
QUICK_SWEEP = NOOP_EVENTS.format(exit=0.4) + "event_idle_s = 1.0\n"
BEYOND_A_CLOCK = (1e306, 1.7e308, -1e306, -1.7e308, 1e11, -1e11)


@pytest.mark.slow
def test_a_timestamp_no_clock_can_mean_is_refused_and_the_daemon_serves_on(tmp_path):
    d = Daemon(tmp_path, models=QUICK_SWEEP)
    d.start()
    try:
        with Client(d.endpoint, camera_id="far", retries=0) as far, \
                Client(d.endpoint, camera_id="jump", retries=0) as jump, \
                Client(d.endpoint, camera_id="other", retries=0) as other:
            for ts in BEYOND_A_CLOCK:
                with pytest.raises(ServerError, match="above -1e11 and below 1e11") as refused:
                    far.infer(SEEN, timestamp=ts)
                assert refused.value.code == "malformed"
                other.infer(SEEN)
            far.infer(SEEN, timestamp=-99_999_999_999.0)     # the range's ends are a clock's
            far.infer(SEEN, timestamp=99_999_999_999.0)
            jump.infer(SEEN, timestamp=T0)                     # an event starts at T0...
            with pytest.raises(ServerError, match="below 1e11"):
                jump.infer(SEEN, timestamp=1e306)              # ...and its clock jumps
            time.sleep(2.0)  # the sweep ends jump's event (event_idle_s 1 s)
            other.infer(SEEN)
            assert d.running()
        assert d.stop() == 0
    finally:
        stop_by_pid(d)
    ends = {e["camera"]: e for e in action_events(d) if e["kind"] == "end"}
    assert (ends["jump"]["reason"], ends["jump"]["ended"]) == ("camera-silent", T0)
    assert ends["far"]["started"] == -99_999_999_999.0


def in_process(tmp_path) -> Server:
    endpoint = f"ipc://{tmp_path / 'd.sock'}"
    path = write_config(tmp_path / "stgcnd.toml", endpoint, tmp_path / "engines",
                        models=QUICK_SWEEP)
    path.write_text(path.read_text().replace("stats_interval = 1.0", "stats_interval = 0.2"))
    config = load_config(path)
    return Server(config, Wakeup(), Notifier(env={}), lambda: config)


def serving(server: Server) -> threading.Thread:
    thread = threading.Thread(target=lambda: setattr(server, "exit_code", server.serve()),
                              name="serve", daemon=True)
    thread.start()
    return thread


def stopped(server: Server, thread: threading.Thread) -> int | None:
    server.wakeup.stop.set()
    server.wakeup.wake()
    thread.join(30)
    assert not thread.is_alive()
    return getattr(server, "exit_code", None)


@pytest.mark.slow
def test_a_fault_in_one_cameras_events_is_that_cameras_alone(tmp_path, monkeypatch):
    server = in_process(tmp_path)
    endpoint = server.config.endpoint
    events = server.events.rules
    observe, broken = events.observe, {"bad"}

    def faulty(camera, *args, **kwargs):  # a bug in the events, met for `bad` only
        if camera in broken:
            raise ZeroDivisionError("injected")
        return observe(camera, *args, **kwargs)

    monkeypatch.setattr(events, "observe", faulty)
    with capture_logs() as logs:
        thread = serving(server)
        try:
            with Client(endpoint, camera_id="bad", retries=0) as bad, \
                    Client(endpoint, camera_id="good", retries=0) as good:
                broken.clear()
                bad.infer(SEEN)                      # both start an event
                good.infer(SEEN)
                broken.add("bad")
                with pytest.raises(ServerError, match="internal error: ZeroDivisionError") \
                        as failed:
                    bad.infer(SEEN)
                assert failed.value.code == "internal"
                for _ in range(3):
                    good.infer(SEEN)
                broken.clear()
                bad.infer(SEEN)                      # its events start over
        finally:
            code = stopped(server, thread)
    assert code == 0
    crashed = [e for e in logs if e["event"] == "request_crashed"]
    assert [(e["log_level"], e["camera"], e["where"], e["events_ended"]) for e in crashed] \
        == [("error", "bad", "prediction", 1)]
    said = [(e["camera"], e["kind"], e.get("reason")) for e in logs
            if e["event"] == "action_event"]
    assert said[:4] == [("bad", "start", None), ("good", "start", None),
                        ("bad", "end", "internal"), ("bad", "start", None)]
    assert sorted(said[4:]) == [("bad", "end", "shutdown"), ("good", "end", "shutdown")]


@pytest.mark.slow
def test_a_fault_in_the_sweep_or_the_stats_tick_is_one_line_and_the_loop_goes_on(
        tmp_path, monkeypatch):
    server = in_process(tmp_path)

    def broken(*_args):
        raise RuntimeError("injected")

    monkeypatch.setattr(server.events, "expire_silent", broken)  # every 0.1 s
    monkeypatch.setattr(server.events, "tick", broken)           # every tick's report (0.2 s)
    monkeypatch.setattr(server.cameras, "reclaim_idle", broken)  # ... and its housekeeping
    with capture_logs() as logs:
        thread = serving(server)
        try:
            with Client(server.config.endpoint, camera_id="cam", retries=0) as cam:
                for _ in range(10):
                    cam.infer(SEEN)
                    time.sleep(0.1)
                assert cam.ping()
        finally:
            code = stopped(server, thread)
    assert code == 0
    failed = [(e["log_level"], e["code"]) for e in logs if e["event"] == "loop_duty_failed"]
    assert sorted(failed) == [("error", "events_sweep"), ("error", "housekeeping"),
                              ("error", "stats_tick")]
