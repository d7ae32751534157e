"""The device nodes CUDA opens, and whether the systemd unit lets the daemon open them.

Under `DevicePolicy=closed` a node missing from `DeviceAllow=` makes CUDA fail under the unit
only (auto then serves on the CPU while doctor passes), so doctor checks the nodes its own
process opened against the unit, and the tests check the unit against the lists below.
"""

from __future__ import annotations

import grp
import os
import re
from dataclasses import dataclass
from pathlib import Path

# Paths a CUDA process on a Jetson or a discrete GPU opens: what doctor reports.
CUDA_NODE = re.compile(r"^/dev/(nv|host1x|dri/|nvgpu/)")


# Known lists (L4T's udev rules give the groups):
# - R35 (JetPack 5): the nvhost and nvmap nodes, group video;
# - R36 (JetPack 6): the nvgpu/igpu0 nodes and nvmap (video), /dev/host1x-fence (video) and the
#   DRM render node (group render), reported on an Orin NX whose daemon fell back to the CPU
#   under the unit (issue #31);
# - R38 (JetPack 7, Thor): the discrete driver's nvidia* nodes (mode 0666: no group), from
#   NVIDIA's open GPU kernel modules; not seen on a board by us.
@dataclass(frozen=True)
class Node:
    path: str
    driver: str | None = None  # its name in /proc/devices (DeviceAllow=char-NAME), if known
    group: str | None = None   # the group that may open it (None: anyone)


def _video(*paths: str) -> tuple[Node, ...]:
    return tuple(Node(p, group="video") for p in paths)


KNOWN: dict[str, tuple[Node, ...]] = {
    "R35": _video("/dev/nvhost-ctrl", "/dev/nvhost-ctrl-gpu", "/dev/nvhost-gpu",
                  "/dev/nvhost-as-gpu", "/dev/nvhost-tsg-gpu", "/dev/nvhost-prof-gpu",
                  "/dev/nvhost-dbg-gpu", "/dev/nvhost-power-gpu", "/dev/nvhost-sched-gpu",
                  "/dev/nvhost-ctxsw-gpu", "/dev/nvmap"),
    "R36": (*_video("/dev/nvgpu/igpu0/ctrl", "/dev/nvgpu/igpu0/as", "/dev/nvgpu/igpu0/channel",
                    "/dev/nvgpu/igpu0/tsg", "/dev/nvgpu/igpu0/power", "/dev/nvgpu/igpu0/prof",
                    "/dev/nvgpu/igpu0/sched", "/dev/nvgpu/igpu0/nvsched",
                    "/dev/nvgpu/igpu0/ctxsw", "/dev/nvgpu/igpu0/dbg", "/dev/nvmap",
                    "/dev/host1x-fence"),
            Node("/dev/dri/renderD128", driver="drm", group="render")),
    "R38": (Node("/dev/nvidiactl"), Node("/dev/nvidia0"), Node("/dev/nvidia-uvm"),
            Node("/dev/nvidia-uvm-tools"), Node("/dev/nvidia-modeset")),
}


def nodes_in_use(proc: Path = Path("/proc/self")) -> list[str]:
    """The CUDA device nodes a process has open or mapped (call after CUDA is up)."""
    found: set[str] = set()
    try:
        maps = (proc / "maps").read_text()
    except OSError:
        maps = ""
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            found.add(parts[5].strip())
    try:
        fds = os.listdir(proc / "fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            found.add(os.readlink(proc / "fd" / fd))
        except OSError:
            continue  # closed meanwhile
    return sorted(p for p in found if CUDA_NODE.match(p))


def describe(path: str, devices: Path = Path("/proc/devices"),
             group_of: dict[int, str] | None = None) -> Node:
    """A node found on this machine, with its driver's name and its group."""
    try:
        st = os.stat(path)
    except OSError:
        return Node(path)
    major = os.major(st.st_rdev)
    driver = None
    try:
        for line in devices.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == str(major):
                driver = parts[1]
                break
    except OSError:
        pass
    if st.st_mode & 0o006 == 0o006:  # anyone may read and write it
        return Node(path, driver)
    try:
        group = (group_of or {}).get(st.st_gid) or grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return Node(path, driver, group)


@dataclass(frozen=True)
class Unit:
    """What a unit file says about devices: DeviceAllow= entries and the groups."""

    allowed: frozenset[str]
    groups: frozenset[str]
    policy: str

    @classmethod
    def parse(cls, text: str) -> Unit:
        allowed: set[str] = set()
        groups: set[str] = set()
        policy = "auto"
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("#") or "=" not in line:
                continue
            key, value = (s.strip() for s in line.split("=", 1))
            if key == "DeviceAllow" and value:
                allowed.add(value.split()[0])
            elif key == "DeviceAllow":
                allowed.clear()  # an empty assignment resets the list
            elif key in ("Group", "SupplementaryGroups"):
                groups.update(value.split())
            elif key == "DevicePolicy":
                policy = value
        return cls(frozenset(allowed), frozenset(groups), policy)

    def refusals(self, node: Node) -> list[str]:
        """Why the unit would keep the daemon from opening `node` (empty: it may)."""
        why = []
        if self.policy != "auto" and node.path not in self.allowed and not (
                node.driver and f"char-{node.driver}" in self.allowed):
            why.append(f"DeviceAllow={node.path} rw")
        if node.group and node.group not in self.groups:
            why.append(f"SupplementaryGroups={node.group}")
        return why


def unit_gaps(unit: Unit, nodes: list[Node]) -> dict[str, list[str]]:
    """{node: the lines the unit needs for it}, for each node the unit keeps from CUDA."""
    return {n.path: why for n in nodes for why in [unit.refusals(n)] if why}
