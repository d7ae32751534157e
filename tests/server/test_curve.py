"""Remote cameras over tcp with CURVE (issue #25): only authorized keys get answers, a key
bound to cameras cannot touch another camera, and a reachable tcp endpoint without CURVE is
refused at start. Daemons are real `stgcnd serve` processes (noop backend), stopped by pid."""

from __future__ import annotations

import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from stgcnd.cli import main as stgcnd
from stgcnd.errors import UserError
from stgcnd.server.config import Config, ServerConfig
from stgcnd.server.curve import load_authorized, server_keypair
from stgcnd.server.curve_policy import check_security, curve_enabled
from stgcnd_client import Client, Events, Forbidden, Timeout
from stgcnd_client.curve import curve_options
from tests.conftest import REPO
from tests.server.daemon_harness import FRAMES, Daemon, stop_by_pid

NOOP = (f'[[models]]\nname = "demo"\nbackend = "noop"\ndemo = true\nframes = {FRAMES}\n')
WINDOW = np.zeros((3, FRAMES, 33, 1), np.float32)
FRAME = np.zeros((3, 33, 1), np.float32)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(endpoint: str, **server: object) -> Config:
    return Config(server=ServerConfig(endpoint=endpoint, **server))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ fast: units

@pytest.mark.parametrize(("endpoint", "curve", "on"), [
    ("tcp://0.0.0.0:5555", "auto", True), ("tcp://*:5555", "auto", True),
    ("tcp://10.1.2.3:5555", "auto", True), ("tcp://127.0.0.1:5555", "auto", False),
    ("tcp://localhost:5555", "auto", False), ("tcp://[::1]:5555", "auto", False),
    ("ipc:///tmp/x.sock", "auto", False), ("tcp://127.0.0.1:5555", "on", True),
    ("tcp://0.0.0.0:5555", "off", False)])
def test_curve_auto_is_on_for_endpoints_other_machines_reach(endpoint, curve, on):
    assert curve_enabled(_config(endpoint, curve=curve)) is on


def test_reachable_tcp_without_curve_is_refused_unless_insecure():
    with pytest.raises(UserError, match=r"reachable from other machines.*insecure = true"):
        check_security(_config("tcp://0.0.0.0:5555", curve="off"))
    check_security(_config("tcp://0.0.0.0:5555", curve="off", insecure=True))
    check_security(_config("tcp://127.0.0.1:5555", curve="off"))
    check_security(_config("tcp://0.0.0.0:5555"))  # auto: CURVE


def test_server_keypair_is_made_once_with_a_private_secret(tmp_path):
    public, _ = server_keypair(tmp_path / "keys")
    mode = stat.S_IMODE((tmp_path / "keys" / "server.key_secret").stat().st_mode)
    assert mode == 0o600
    assert server_keypair(tmp_path / "keys")[0] == public


def test_keys_round_trip(tmp_path, stgcnd_main):
    """create (bound and not), list, revoke, server; a bad file in the directory is skipped."""
    config = tmp_path / "stgcnd.toml"
    config.write_text(f'[server]\nkeys_dir = "{tmp_path / "keys"}"\n[[models]]\ndemo = true\n')

    def keys(*args: str) -> subprocess.CompletedProcess[str]:
        return stgcnd_main("keys", "--config", str(config), *args, cwd=REPO)

    made = keys("create", "door", "--cameras", "cam1", "cam2", "--out", str(tmp_path / "out"))
    assert made.returncode == 0, made.stderr
    assert keys("create", "yard", "--out", str(tmp_path / "out")).returncode == 0
    again = keys("create", "door", "--out", str(tmp_path / "out"))
    assert again.returncode == 2 and "exists" in again.stderr
    (tmp_path / "keys" / "authorized" / "junk.key").write_text("not a key\n")
    listed = keys("list").stdout.splitlines()
    assert [line.split()[0] for line in listed] == ["door", "yard"]
    assert listed[0].endswith("cam1 cam2") and listed[1].endswith("(any camera)")
    secret = tmp_path / "out" / "door.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert len(curve_options(zmq.curve_keypair()[0], str(secret))) == 3
    assert keys("revoke", "yard").returncode == 0
    assert [k.name for k in load_authorized(tmp_path / "keys" / "authorized").values()] == [
        "door"]
    missing = keys("server")
    assert missing.returncode == 2 and "first start" in missing.stderr
    public, _ = server_keypair(tmp_path / "keys")
    assert keys("server").stdout.splitlines()[0] == public.decode()


def test_client_key_errors_say_what_to_pass(tmp_path):
    with pytest.raises(ValueError, match="needs both server_key"):
        curve_options(zmq.curve_keypair()[0], None)
    with pytest.raises(ValueError, match="40 characters"):
        curve_options(zmq.curve_keypair()[0], ("short", "pair"))
    with pytest.raises(ValueError, match="no secret key"):
        public_file = tmp_path / "x.key"
        zmq.auth.create_certificates(str(tmp_path), "x")
        curve_options(zmq.curve_keypair()[0], str(public_file))


# --------------------------------------------------------------------- slow: real daemons

def _create(config: Path, name: str, out: Path, *cameras: str) -> Path:
    args = ["keys", "--config", str(config), "create", name, "--out", str(out)]
    assert stgcnd([*args, "--cameras", *cameras] if cameras else args) == 0
    return out / f"{name}.key_secret"


@pytest.fixture
def curve_daemon(tmp_path):
    made: list[Daemon] = []

    def start(**config: object) -> Daemon:
        d = Daemon(tmp_path, endpoint=f"tcp://127.0.0.1:{_port()}", models=NOOP, curve="on",
                   keys_dir=str(tmp_path / "keys"), **config)
        made.append(d)
        return d

    yield start
    for d in made:
        stop_by_pid(d, term_timeout=15.0)


@pytest.mark.slow
def test_only_authorized_keys_get_replies_and_revoked_ones_stop(curve_daemon, tmp_path):
    d = curve_daemon()
    good = _create(d.config_path, "good", tmp_path / "out")
    doomed = _create(d.config_path, "doomed", tmp_path / "out")
    d.start()
    server = tmp_path / "keys" / "server.key"
    assert stat.S_IMODE((tmp_path / "keys" / "server.key_secret").stat().st_mode) == 0o600
    stranger = zmq.curve_keypair()
    with Client(d.endpoint, "cam-good", server_key=server, client_key=good) as ok, \
            Client(d.endpoint, "cam-doomed", server_key=server, client_key=doomed) as soon, \
            Client(d.endpoint, "cam-none", timeout=1.0, retries=0) as plain, \
            Client(d.endpoint, "cam-stranger", timeout=1.0, retries=0, server_key=server,
                   client_key=(stranger[0].decode(), stranger[1].decode())) as unknown:
        assert ok.infer(WINDOW).label is not None
        assert soon.ping() > 0
        for refused in (plain, unknown):
            with pytest.raises(Timeout):
                refused.ping()
            assert ok.ping() > 0  # the others are served meanwhile
        (tmp_path / "keys" / "authorized" / "doomed.key").unlink()
        d.notify.skip_seen()
        d.signal(signal.SIGHUP)
        d.notify.wait_for("READY", timeout=60)
        with pytest.raises(Forbidden, match="revoked"):  # connected before: refused
            soon.ping(timeout=1.0)
        with Client(d.endpoint, "cam-doomed-2", timeout=1.0, retries=0, server_key=server,
                    client_key=doomed) as fresh, pytest.raises(Timeout):
            fresh.ping()  # and a new connection fails the handshake
        assert ok.push(FRAME) is None
        stats = ok.stats()
    assert stats["curve"]["clients"] == 1 and stats["curve"]["denied"] >= 2
    assert stats["curve"]["dropped"] >= 1
    assert "curve_denied" in [e["event"] for e in d.log_events()]


@pytest.mark.slow
def test_a_key_bound_to_cam1_cannot_use_cam2(curve_daemon, tmp_path):
    d = curve_daemon()
    cam1 = _create(d.config_path, "cam1-box", tmp_path / "out", "cam1")
    other = _create(d.config_path, "cam2-box", tmp_path / "out", "cam2")
    d.start()
    server = tmp_path / "keys" / "server.key"
    with Client(d.endpoint, "cam2", server_key=server, client_key=other) as victim:
        victim.push(FRAME)
    with Client(d.endpoint, "cam1", server_key=server, client_key=cam1) as own:
        own.push(FRAME)
        stats = own.stats()
    assert list(stats["cameras"]) == ["cam1"]  # cam2 is served, but not this key's to see
    with Client(d.endpoint, "cam2", server_key=server, client_key=cam1) as thief:
        for call in (thief.reset, lambda: thief.push(FRAME), lambda: thief.infer(WINDOW),
                     thief.stats, thief.hello):
            with pytest.raises(Forbidden, match="cam1"):
                call()
    with Client(d.endpoint, "cam2", server_key=server, client_key=other) as victim:
        assert victim.push(FRAME) is None
        assert victim.stats()["cameras"]["cam2"]["requests"] == 2  # its window untouched


@pytest.mark.slow
@pytest.mark.parametrize("insecure", [False, True])
def test_reachable_tcp_without_curve_is_refused_at_start(tmp_path, insecure):
    d = Daemon(tmp_path, endpoint=f"tcp://0.0.0.0:{_port()}", models=NOOP, curve="off",
               insecure=insecure)
    try:
        d.start(wait_ready=insecure)
        if insecure:
            assert d.running()
            return
        assert d.proc is not None and d.proc.wait(timeout=60) == 2
        errors = [e for e in d.log_events() if e.get("event") == "startup_failed"]
        assert "insecure = true" in errors[0]["error"]
        assert "\n" not in errors[0]["error"]
    finally:
        stop_by_pid(d)


def test_a_reachable_events_endpoint_turns_curve_on_or_is_refused():
    ipc, reach = "ipc:///tmp/x.sock", "tcp://0.0.0.0:5556"
    assert curve_enabled(_config(ipc, events_endpoint=reach))
    with pytest.raises(UserError, match="read every event"):
        check_security(_config(ipc, events_endpoint=reach, curve="off"))
    check_security(_config(ipc, events_endpoint=reach, curve="off", insecure=True))


# Empty windows (no person) from throwaway cameras left silent: neither #34 gate applies.
EVENTS_NOOP = NOOP + 'labels = ["normal", "shoplifting"]\n[models.events]\nenter = 0.5\n' \
                     'exit = 0.4\nmin_duration_s = 0.0\nmin_usable = 0.0\nevent_idle_s = 600.0\n'


@pytest.mark.slow
def test_events_over_curve_reach_only_subscribers_with_a_key(curve_daemon, tmp_path):
    """The events PUB socket is secured like the requests: a subscriber with an authorized
    key gets the camera's event, one without a key never connects."""
    d = curve_daemon(events_endpoint=f"tcp://127.0.0.1:{_port()}")
    write = (d.config_path.read_text().split("[[models]]")[0] + EVENTS_NOOP)
    d.config_path.write_text(write)
    key = _create(d.config_path, "site", tmp_path / "out")
    d.start()
    server = tmp_path / "keys" / "server.key"
    events_at = d.config_path.read_text().split('events_endpoint = "')[1].split('"')[0]
    with Events(events_at, server_key=server, client_key=key) as keyed, \
            Events(events_at) as plain:
        # The subscription reaches the publisher a moment after the handshake: throwaway
        # cameras until the keyed subscriber hears one (each starts one event).
        event = None
        for i in range(50):
            with Client(d.endpoint, f"cam{i}", server_key=server, client_key=key) as cam:
                cam.infer(WINDOW)
            event = keyed.recv(timeout_ms=200)
            if event is not None:
                break
        assert event is not None and event["kind"] == "start"
        assert event["camera"].startswith("cam")
        assert plain.recv(timeout_ms=500) is None       # no key: never connected


@pytest.mark.slow
def test_a_revoked_keys_subscriber_gets_no_event_after_the_reload(curve_daemon, tmp_path):
    """Hardening III (#36, item 6): a subscriber connected with a key that is then revoked is
    cut at the reload (its SUB reconnects, and the handshake refuses the key), while one with
    a key still authorized keeps getting every event."""
    d = curve_daemon(events_endpoint=f"tcp://127.0.0.1:{_port()}")
    d.config_path.write_text(d.config_path.read_text().split("[[models]]")[0] + EVENTS_NOOP)
    good = _create(d.config_path, "good", tmp_path / "out")
    doomed = _create(d.config_path, "doomed", tmp_path / "out")
    d.start()
    server = tmp_path / "keys" / "server.key"
    events_at = d.config_path.read_text().split('events_endpoint = "')[1].split('"')[0]

    def next_event(subscribers: list[Events], prefix: str) -> list[dict | None]:
        """Throwaway cameras until the first subscriber hears one; what each then got."""
        for i in range(50):
            with Client(d.endpoint, f"{prefix}{i}", server_key=server, client_key=good) as cam:
                cam.infer(WINDOW)
            got = [s.recv(timeout_ms=300) for s in subscribers]
            if got[0] is not None:
                return got
        raise AssertionError("the subscriber with a valid key heard no event")

    def both_hear(subscribers: list[Events]) -> None:
        """Throwaway cameras until each subscriber heard a start (a SUB's subscription
        reaches the daemon some time after its connect, each on its own), then the rest of
        what they were sent is read."""
        heard = [False] * len(subscribers)
        for i in range(50):
            with Client(d.endpoint, f"before{i}", server_key=server, client_key=good) as cam:
                cam.infer(WINDOW)
            for k, s in enumerate(subscribers):
                got = s.recv(timeout_ms=300)
                heard[k] = heard[k] or (got is not None and got["kind"] == "start")
            if all(heard):
                break
        assert all(heard), heard
        for s in subscribers:
            while s.recv(timeout_ms=200) is not None:
                pass

    with Events(events_at, server_key=server, client_key=good) as kept, \
            Events(events_at, server_key=server, client_key=doomed) as revoked:
        both_hear([kept, revoked])
        (tmp_path / "keys" / "authorized" / "doomed.key").unlink()
        d.notify.skip_seen()
        d.signal(signal.SIGHUP)
        d.notify.wait_for("READY", timeout=60)
        after = next_event([kept, revoked], "after")
        assert after[0]["kind"] == "start"
        late = revoked.recv(timeout_ms=1000)
        assert after[1] is None and late is None, (after, late)
    assert "events_subscriber_cut" in [e["event"] for e in d.log_events()]


@pytest.mark.slow
def test_refused_handshakes_are_explained_to_the_client_and_in_the_log(curve_daemon, tmp_path):
    """Issue #32, item 7: a camera without keys is told the endpoint may need them (after its
    timeout, not 30 s), and the daemon logs each kind of refusal once per 10 s with a count:
    no keys, a server key that is not the daemon's, a key it does not know."""
    d = curve_daemon()
    good = _create(d.config_path, "good", tmp_path / "out")
    d.start()
    server = tmp_path / "keys" / "server.key"
    stranger = tuple(k.decode() for k in zmq.curve_keypair())
    with Client(d.endpoint, "cam-none", timeout=1.0, retries=0) as plain, \
            pytest.raises(Timeout) as info:
        plain.ping()
    for named in ("may need CURVE keys", "server_key=", "client_key=", "stgcnd keys create"):
        assert named in str(info.value)
    for server_key, client_key in ((zmq.curve_keypair()[0].decode(), good),
                                   (server, stranger)):
        with Client(d.endpoint, "cam-refused", timeout=1.0, retries=0, server_key=server_key,
                    client_key=client_key) as refused, pytest.raises(Timeout):
            refused.ping()
    with Client(d.endpoint, "cam-good", server_key=server, client_key=good) as ok:
        denied = ok.stats()["curve"]["denied"]
    lines = [e for e in d.log_events() if e["event"] == "curve_denied"]
    reasons = [e["reason"] for e in lines]
    assert len(set(reasons)) == len(reasons)  # one line per reason, however many retries
    # The keyless client: a mismatch, or its hang-up on finding it first (handshakes.py).
    assert {"unknown-key", "wrong-server-key"} < set(reasons) <= {
        "unknown-key", "wrong-server-key", "no-keys", "hung-up"}
    assert denied > len(lines)  # each client retried its handshake
    by_reason = {e["reason"]: e for e in lines}
    for keyless in {"no-keys", "hung-up"} & set(by_reason):
        assert "stgcnd keys create" in by_reason[keyless]["action"]
    assert "stgcnd keys server" in by_reason["wrong-server-key"]["action"]
    assert by_reason["unknown-key"]["client_key"] == stranger[0]
    assert all(e["peer"] and e["denied"] >= 1 for e in lines)


@pytest.mark.slow
def test_another_keys_requests_never_turn_a_cameras_feed_refused(curve_daemon, tmp_path):
    """Hardening IV (#41, item 4): a key bound to mal-cam pushing as door-1 is answered
    `forbidden`, counted against its key (curve.forbidden), and charged nothing of door-1's:
    door-1, sending good frames, stays `ok` (no `feed` change, no refused input, no error in
    its latency line, no log line naming it as the camera). Before: `ok -> refused`."""
    d = curve_daemon()
    d.config_path.write_text(d.config_path.read_text().replace("stats_interval = 1.0",
                                                               "stats_interval = 0.3"))
    door = _create(d.config_path, "door-box", tmp_path / "out", "door-1")
    mal = _create(d.config_path, "mal-box", tmp_path / "out", "mal-cam")
    d.start()
    server = tmp_path / "keys" / "server.key"
    good = np.full((3, 33, 1), 0.5, np.float32)
    good[2] = 1.0  # every joint seen, in frame
    refused = 0
    with Client(d.endpoint, "door-1", server_key=server, client_key=door) as victim, \
            Client(d.endpoint, "door-1", server_key=server, client_key=mal) as thief:
        end = time.monotonic() + 3.0  # ten stats intervals, feed_intervals = 2
        while time.monotonic() < end:
            victim.push(good)
            for _ in range(5):
                with pytest.raises(Forbidden, match="mal-cam"):
                    thief.push(good)
                refused += 1
            time.sleep(0.02)
        stats = victim.stats()
    assert stats["feeds"]["door-1"]["state"] == "ok", stats["feeds"]
    assert stats["curve"]["forbidden"] == {"mal-box": refused}
    events = d.log_events()
    feed_changes = [e for e in events if e["event"] == "feed_health"]
    assert not feed_changes, feed_changes
    quality = [e for e in events if e["event"] == "skeleton_quality" and e["camera"] == "door-1"]
    assert quality and all(e["refused_input"] == 0 for e in quality), quality
    latency = [e for e in events if e["event"] == "latency" and e.get("camera") == "door-1"]
    assert latency and all(e["errors"] == 0 for e in latency), latency
    rejected = [e for e in events if e["event"] == "request_rejected"]
    assert rejected and all(e["camera"] is None for e in rejected), rejected
    assert rejected[0]["client_key"] == "mal-box" and rejected[0]["named_camera"] == "door-1"
