"""The systemd unit, linted offline (systemd itself is never booted in tests)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "stgcnd.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_verify_is_clean_and_exposure_at_most_4():
    r = subprocess.run(["bash", str(REPO / "systemd" / "verify.sh")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    exposure = float(r.stdout.rsplit("exposure:", 1)[1].split()[0])
    assert exposure <= 4.0


def test_unit_promises_what_the_daemon_does():
    text = UNIT.read_text()
    settings = dict(line.split("=", 1) for line in text.splitlines()
                    if "=" in line and not line.startswith("#"))
    assert settings["Type"] == "notify" and settings["NotifyAccess"] == "main"
    assert settings["Restart"] == "on-failure"
    # The daemon's drain deadline (drain_timeout, default 10 s) must end before systemd kills.
    from stgcnd.server.config import ServerConfig

    assert ServerConfig().drain_timeout < float(settings["TimeoutStopSec"])
    assert ServerConfig().stall_timeout <= float(settings["WatchdogSec"])
    for forbidden in ("PrivateDevices=yes", "MemoryDenyWriteExecute=yes"):
        assert forbidden not in text  # both break CUDA
    assert "DeviceAllow=/dev/nvmap rw" in text and "DeviceAllow=/dev/nvidiactl rw" in text
    assert "RuntimeDirectory=stgcnd" in text and "StateDirectory=stgcnd" in text


# --- the device nodes CUDA opens (issue #31, item 5) ----------------------------------------

def cuda_nodes_here() -> list[str]:
    """The nodes this process has open or mapped once CUDA is up (doctor's list); empty on
    a machine without a GPU."""
    from stgcnd.errors import BackendUnavailable
    from stgcnd.runtimes.cuda import CudaError, make_current
    from stgcnd_tools.doctor.device_nodes import nodes_in_use

    try:
        make_current()
    except (BackendUnavailable, CudaError):
        pass
    return nodes_in_use()


def test_the_unit_allows_every_node_cuda_uses_here_and_on_the_known_boards():
    from stgcnd_tools.doctor.device_nodes import KNOWN, Unit, describe, unit_gaps

    unit = Unit.parse(UNIT.read_text())
    assert unit.policy == "closed"
    here = [describe(p) for p in cuda_nodes_here()]
    for release, nodes in [("this machine", here), *KNOWN.items()]:
        assert unit_gaps(unit, list(nodes)) == {}, f"the unit keeps CUDA out on {release}"


def test_nodes_in_use_reads_maps_and_fds(tmp_path):
    from stgcnd_tools.doctor.device_nodes import nodes_in_use

    proc = tmp_path / "proc"
    (proc / "fd").mkdir(parents=True)
    (proc / "maps").write_text(
        "ffff8000-ffff9000 rw-s 00000000 00:05 12 /dev/nvmap\n"
        "ffff9000-ffffa000 r-xp 00000000 08:01 99 /usr/lib/libcuda.so.1\n"
        "ffffa000-ffffb000 rw-p 00000000 00:00 0 \n")
    for fd, target in enumerate(("/dev/host1x-fence", "/dev/dri/renderD128",
                                 "/dev/nvgpu/igpu0/ctrl", "/dev/null", "socket:[1]")):
        (proc / "fd" / str(fd)).symlink_to(target)
    assert nodes_in_use(proc) == ["/dev/dri/renderD128", "/dev/host1x-fence",
                                  "/dev/nvgpu/igpu0/ctrl", "/dev/nvmap"]


def test_a_unit_without_the_jetpack6_nodes_is_caught_with_its_fix(tmp_path):
    from stgcnd_tools.doctor.device_nodes import KNOWN, Node, Unit, describe, unit_gaps
    from stgcnd_tools.doctor.unit import FAIL, OK, unit_devices

    # The unit before issue #31: R36's fence and render nodes, and the render group, missing.
    old = "\n".join(line for line in UNIT.read_text().splitlines()
                    if "host1x" not in line and "char-drm" not in line)
    old = old.replace("SupplementaryGroups=video render", "SupplementaryGroups=video")
    gaps = unit_gaps(Unit.parse(old), list(KNOWN["R36"]))
    assert gaps == {"/dev/host1x-fence": ["DeviceAllow=/dev/host1x-fence rw"],
                    "/dev/dri/renderD128": ["DeviceAllow=/dev/dri/renderD128 rw",
                                            "SupplementaryGroups=render"]}
    assert unit_gaps(Unit.parse(old), list(KNOWN["R35"])) == {}
    assert Unit.parse("DevicePolicy=auto\n").refusals(Node("/dev/x")) == []

    # doctor, on nodes as this machine describes them (mode 0666: no group needed); the unit
    # allows /dev/null, not /dev/zero.
    from stgcnd_tools.doctor.unit import UnitFile

    path = tmp_path / "stgcnd.service"
    path.write_text(old)
    here = [describe(p) for p in ("/dev/null", "/dev/zero")]
    bad = unit_devices(UnitFile(path), here, "opened here")
    assert bad["status"] == FAIL and "could not open /dev/zero " in bad["detail"]
    assert "DeviceAllow=/dev/zero rw" in bad["fix"] and "systemctl edit stgcnd" in bad["fix"]
    assert unit_devices(UnitFile(UNIT), here[:1])["status"] == OK
    assert unit_devices(UnitFile(UNIT), [])["status"] == "skip"
