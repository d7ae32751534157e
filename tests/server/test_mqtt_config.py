"""What `config check` (and `serve`, which runs the same checks) says of the events' keys
(issue #42, item 5): a heartbeat the loop cannot keep is refused; a password file others
may read, or its group rewrite, is refused with the chmod that fixes it; a broker off this
machine is warned about when the systemd unit's address filter would keep it out."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stgcnd.errors import UserError
from stgcnd.server.config import load_config
from stgcnd.server.config_checks import check_config
from tests.conftest import REPO

MODEL = '[[models]]\nname = "demo"\ndemo = true\nbackend = "noop"\n'


def write(tmp_path, text: str):
    path = tmp_path / "stgcnd.toml"
    path.write_text(MODEL + text)
    return path


@pytest.mark.parametrize("beat", [0.002, 0.05])
def test_a_heartbeat_faster_than_the_loop_is_refused(tmp_path, beat):
    with pytest.raises(UserError) as caught:
        load_config(write(tmp_path, f"[server]\nevents_heartbeat_s = {beat}\n"))
    assert "at least 0.1, or 0 for no heartbeats" in str(caught.value)


@pytest.mark.parametrize("beat", [0, 0.1, 2.0])
def test_heartbeats_the_loop_keeps_are_accepted(tmp_path, beat):
    config = load_config(write(tmp_path, f"[server]\nevents_heartbeat_s = {beat}\n"))
    assert config.server.events_heartbeat_s == beat


def mqtt_with_password(tmp_path, mode: int):
    secret = tmp_path / "mqtt.password"
    secret.write_text("hunter2\n")
    secret.chmod(mode)
    return load_config(write(tmp_path, f'[events.mqtt]\nbroker = "mqtt://127.0.0.1"\n'
                                       f'username = "stgcnd"\npassword_file = "{secret}"\n'))


@pytest.mark.parametrize(("mode", "says"), [(0o644, "anyone may read it"),
                                            (0o604, "anyone may read it"),
                                            (0o620, "its group may write it")])
def test_a_password_file_others_may_read_is_refused(tmp_path, mode, says):
    with pytest.raises(UserError) as caught:
        check_config(mqtt_with_password(tmp_path, mode))
    message = str(caught.value)
    assert says in message and f"chmod 600 {tmp_path / 'mqtt.password'}" in message


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o400])
def test_a_private_password_file_is_accepted(tmp_path, mode):
    check_config(mqtt_with_password(tmp_path, mode))


def config_check(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stgcnd", "config", "check", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def test_config_check_warns_of_a_remote_broker_the_unit_blocks(tmp_path):
    done = config_check(write(tmp_path, '[events.mqtt]\nbroker = "mqtt://10.0.0.5"\n'))
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warning and "the unit refuses 10.0.0.5" in warning[0], done.stderr
    assert "IPAddressAllow=10.0.0.5" in warning[0]


def test_config_check_says_nothing_of_a_broker_on_loopback(tmp_path):
    done = config_check(write(tmp_path, '[events.mqtt]\nbroker = "mqtt://127.0.0.1"\n'))
    assert done.returncode == 0, done.stderr
    assert "warning:" not in done.stderr


def test_the_removed_usable_visibility_key_says_what_replaced_it(tmp_path):
    """[models.events] usable_visibility went when one threshold came to decide both the
    events' gate and the feed's low-visibility (issue #42, item 4): a file that still sets it
    is told what to set instead, not "unknown key"."""
    path = tmp_path / "stgcnd.toml"
    path.write_text(MODEL + "[models.events]\nusable_visibility = 0.3\n")
    with pytest.raises(UserError) as caught:
        load_config(path)
    assert "usable_visibility was removed" in str(caught.value)
    assert "[server] visibility_threshold" in str(caught.value)
