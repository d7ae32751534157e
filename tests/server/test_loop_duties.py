"""Issue #44: the I/O loop's periodic duties as one table (server/duties.py): each runs when
due, in the table's order, its interval read after each run (a reload may change
stats_interval); a duty that raises is contained by the guard and the others run. In a real
Server (in process, its real sockets and a real notify socket), a fault in the watchdog duty
is one error line and the loop goes on: WATCHDOG=1 keeps coming and cameras are served."""

from __future__ import annotations

import time

import pytest
from structlog.testing import capture_logs

from stgcnd.server.config import load_config
from stgcnd.server.duties import Duties, Duty
from stgcnd.server.notify import Notifier
from stgcnd.server.server import Server
from stgcnd.server.wakeup import Wakeup
from stgcnd_client import Client
from tests.server.daemon_harness import NotifySocket, write_config
from tests.server.test_event_faults import serving, stopped
from tests.server.test_event_inputs import SEEN


def guarded(failed: list[str]):
    def guard(name, work, *args):
        try:
            return work(*args)
        except Exception:
            failed.append(name)
            return None
    return guard


def test_duties_run_when_due_in_the_tables_order_each_at_its_own_interval():
    ran: list[tuple[str, float]] = []
    interval = [2.0]
    duties = Duties([
        Duty("often", lambda now: ran.append(("often", now)), lambda: 0.1),
        Duty("tick", lambda now: ran.append(("tick", now)), lambda: interval[0],
             first=interval[0]),
    ], guarded([]), now=100.0)
    assert duties.next_due == 100.0
    duties.run_due(100.0)
    assert ran == [("often", 100.0)] and duties.next_due == pytest.approx(100.1)
    duties.run_due(100.05)  # nothing due yet
    assert ran == [("often", 100.0)]
    duties.run_due(102.0)
    assert ran[1:] == [("often", 102.0), ("tick", 102.0)]
    interval[0] = 5.0  # a reload changed it: read at the next tick, which is due at 104
    for now in (104.0, 108.0, 109.0):
        duties.run_due(now)
    assert [now for name, now in ran if name == "tick"] == [102.0, 104.0, 109.0]


def test_a_duty_that_raises_is_the_guards_and_the_next_duty_runs():
    failed: list[str] = []
    ran: list[str] = []

    def broken(now: float) -> None:
        raise RuntimeError("injected")

    duties = Duties([Duty("broken", broken, lambda: 1.0),
                     Duty("after", lambda now: ran.append("after"), lambda: 1.0)],
                    guarded(failed), now=0.0)
    duties.run_due(0.0)
    duties.run_due(1.0)
    assert failed == ["broken", "broken"] and ran == ["after", "after"]


@pytest.mark.slow
def test_a_fault_in_the_watchdog_duty_is_one_line_and_the_loop_pings_on(tmp_path,
                                                                         monkeypatch):
    notify = NotifySocket(tmp_path / "notify.sock")
    config = load_config(write_config(tmp_path / "stgcnd.toml", f"ipc://{tmp_path / 'd.sock'}",
                                      tmp_path / "engines"))
    server = Server(config, Wakeup(), Notifier(env={  # WATCHDOG=1 every 0.1 s
        "NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "200000"}), lambda: config)
    calls = [0]
    stalled = server.stalled_executors

    def broken_once(now: float) -> list[str]:
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("injected")
        return stalled(now)

    monkeypatch.setattr(server, "stalled_executors", broken_once)
    try:
        with capture_logs() as logs:
            thread = serving(server)
            try:
                deadline = time.monotonic() + 10
                while calls[0] < 6 and time.monotonic() < deadline:
                    time.sleep(0.05)
                with Client(server.config.endpoint, camera_id="cam", retries=0) as cam:
                    cam.infer(SEEN)
                notify.read(0.3)
            finally:
                code = stopped(server, thread)
    finally:
        notify.close()
    assert code == 0 and calls[0] >= 6
    failed = [(e["log_level"], e["code"]) for e in logs if e["event"] == "loop_duty_failed"]
    assert failed == [("error", "watchdog")]
    pings = [m for m in notify.messages if m.get("WATCHDOG") == "1"]
    assert len(pings) >= 4  # before the fault and after it
