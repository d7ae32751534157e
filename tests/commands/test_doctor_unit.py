"""`stgcnd doctor` checks the systemd unit before its first start (issue #43, item 3).

A board's root file system in real formats under --root (its L4T release, /etc/passwd,
/etc/group, the unit installed where docs/jetson.md installs it, drop-ins as `systemctl edit`
writes them) and the daemon's configuration through --config: every line the unit lacks is
named, for the device nodes CUDA opens, the user and groups it runs as (a missing `render`
group fails the unit with 216/GROUP) and its address filter against the configuration's
endpoints and MQTT broker.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO

UNIT = REPO / "systemd" / "stgcnd.service"
DATA = REPO / "tests" / "commands" / "data"
PASSWD = "root:x:0:0:root:/root:/bin/bash\nstgcnd:x:998:998::/var/lib/stgcnd:/usr/sbin/nologin\n"
GROUPS = "root:x:0:\nvideo:x:44:\nrender:x:109:\nstgcnd:x:998:\n"


def board(tmp_path: Path, release: str = "r36.4.3", groups: str = GROUPS,
          unit: str | None = None) -> Path:
    root = tmp_path / "root"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    (root / "proc" / "device-tree").mkdir(parents=True)
    shutil.copy(DATA / f"nv_tegra_release.{release}", root / "etc" / "nv_tegra_release")
    (root / "proc" / "device-tree" / "model").write_text("NVIDIA Orin NX Developer Kit\x00")
    (root / "etc" / "passwd").write_text(PASSWD)
    (root / "etc" / "group").write_text(groups)
    installed = root / "etc" / "systemd" / "system" / "stgcnd.service"
    installed.write_text(UNIT.read_text() if unit is None else unit)
    return root


def dropin(root: Path, text: str) -> None:
    """What `sudo systemctl edit stgcnd` leaves."""
    d = root / "etc" / "systemd" / "system" / "stgcnd.service.d"
    d.mkdir(exist_ok=True)
    (d / "override.conf").write_text("[Service]\n" + text)


def config(tmp_path: Path, server: str = "", events: str = "") -> Path:
    path = tmp_path / "stgcnd.toml"
    path.write_text(f"[server]\n{server}\n{events}\n[[models]]\nname = \"m\"\ndemo = true\n")
    return path


def unit_report(stgcnd_main, root: Path, *args: str) -> tuple[int, dict[str, dict]]:
    r = stgcnd_main("doctor", "--json", "--root", str(root), *args)
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]
              if c["name"].startswith("unit")}
    return r.returncode, checks


def test_a_root_without_the_render_group_is_caught_before_the_first_start(tmp_path,
                                                                           stgcnd_main):
    root = board(tmp_path, groups=GROUPS.replace("render:x:109:\n", ""))
    code, checks = unit_report(stgcnd_main, root)
    accounts = checks["unit: user and groups"]
    assert code == 1 and accounts["status"] == "fail"
    assert "group render does not exist" in accounts["detail"]
    assert "216/GROUP" in accounts["detail"]
    assert "sudo groupadd --system render" in accounts["fix"]

    (root / "etc" / "group").write_text(GROUPS)  # the fix applied
    code, checks = unit_report(stgcnd_main, root)
    assert code == 0 and checks["unit: user and groups"]["status"] == "ok", checks


def test_the_unit_s_user_must_exist(tmp_path, stgcnd_main):
    root = board(tmp_path)
    (root / "etc" / "passwd").write_text(PASSWD.splitlines()[0] + "\n")
    _, checks = unit_report(stgcnd_main, root)
    assert "User=stgcnd does not exist" in checks["unit: user and groups"]["detail"]
    assert "sudo useradd --system stgcnd" in checks["unit: user and groups"]["fix"]


def test_device_nodes_of_the_board_s_release_and_drop_ins_are_read(tmp_path, stgcnd_main):
    """A unit without JetPack 6's render node (as before issue #31), on an R36 root: named,
    and the drop-in that `systemctl edit` writes with the fix is read."""
    old = "\n".join(line for line in UNIT.read_text().splitlines() if "char-drm" not in line)
    root = board(tmp_path, unit=old)
    code, checks = unit_report(stgcnd_main, root)
    nodes = checks["unit: device nodes"]
    assert code == 1 and nodes["status"] == "fail", nodes
    assert "/dev/dri/renderD128" in nodes["detail"] and "L4T R36" in nodes["detail"]
    assert "DeviceAllow=/dev/dri/renderD128 rw" in nodes["fix"]
    dropin(root, "DeviceAllow=char-drm rw\n")
    code, checks = unit_report(stgcnd_main, root)
    assert checks["unit: device nodes"]["status"] == "ok", checks["unit: device nodes"]
    # JetPack 5 (R35) never opens the render node: the old unit was right there.
    root5 = board(tmp_path / "r35", release="r35.4.1", unit=old)
    assert unit_report(stgcnd_main, root5)[1]["unit: device nodes"]["status"] == "ok"


def test_the_address_filter_against_the_configuration(tmp_path, stgcnd_main):
    root = board(tmp_path)
    remote = config(tmp_path, 'endpoint = "tcp://0.0.0.0:5555"\ninsecure = true\n'
                              "memory_reserve_mb = 1000",
                    '[events.mqtt]\nbroker = "mqtt://10.1.2.3"')
    code, checks = unit_report(stgcnd_main, root, "--config", str(remote))
    addresses = checks["unit: address filter"]
    assert code == 1 and addresses["status"] == "fail"
    assert "cameras on tcp://0.0.0.0:5555: the unit lets in no address off this machine" \
        in addresses["detail"]
    assert "the MQTT broker mqtt://10.1.2.3: the unit refuses 10.1.2.3" in addresses["detail"]
    assert "IPAddressAllow=10.1.2.3" in addresses["fix"]
    assert "IPAddressAllow=<your cameras' network" in addresses["fix"]

    dropin(root, "IPAddressAllow=10.0.0.0/24\nIPAddressAllow=10.1.2.3\n")
    code, checks = unit_report(stgcnd_main, root, "--config", str(remote))
    assert code == 0 and checks["unit: address filter"]["status"] == "ok", checks

    # A camera network bound by address: its /24 is named.
    bound = config(tmp_path, 'endpoint = "tcp://192.168.7.20:5555"\ninsecure = true')
    _, checks = unit_report(stgcnd_main, board(tmp_path / "b"), "--config", str(bound))
    assert "IPAddressAllow=192.168.7.0/24" in checks["unit: address filter"]["fix"]
    # The default configuration (a Unix socket) needs nothing of the filter.
    assert unit_report(stgcnd_main, root)[1]["unit: address filter"]["status"] == "ok"


def test_unit_names_a_file_and_a_missing_one_fails(tmp_path, stgcnd_main):
    root = board(tmp_path)
    (root / "etc" / "systemd" / "system" / "stgcnd.service").unlink()
    code, checks = unit_report(stgcnd_main, root)
    assert code == 0 and checks == {}  # not installed, not asked: nothing to check
    code, checks = unit_report(stgcnd_main, root, "--unit")
    assert code == 1 and "not found" in checks["unit"]["detail"]
    assert "sudo install -m 0644 systemd/stgcnd.service" in checks["unit"]["fix"]
    code, checks = unit_report(stgcnd_main, root, "--unit", str(UNIT))
    assert code == 0 and {c["status"] for c in checks.values()} == {"ok"}, checks


def test_a_config_that_does_not_load_is_said_and_the_defaults_used(tmp_path, stgcnd_main):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nmemory_reserve_mb = \"lots\"\n")
    r = stgcnd_main("doctor", "--config", str(bad))
    assert r.returncode == 0
    assert f"config      {bad}: UNREADABLE, the defaults are used:" in r.stdout


@pytest.mark.parametrize("reserve", [0, 700])
def test_doctor_takes_the_reserve_and_store_from_the_config(tmp_path, stgcnd_main, reserve):
    path = config(tmp_path, f"memory_reserve_mb = {reserve}\n"
                            f'engines_dir = "{tmp_path / "store"}"')
    report = json.loads(stgcnd_main("doctor", "--json", "--config", str(path)).stdout)
    assert report["config"] == {"source": str(path)}
    assert report["store"].get("root") == str(tmp_path / "store") or \
        not report["store"]["available"]
    if report["driver"].get("available"):  # a GPU here: the plan's figures
        assert report["driver"]["reserve_mb"] == reserve
