"""`stgcnd doctor`'s checks of the systemd unit, before its first start: what it lets the
daemon open (device nodes), run as (users and groups that must exist) and reach (its address
filter against the configuration's endpoints and MQTT broker). Each missing line is named,
with where to put it. The address filter's check is the daemon's (server/unit_filter.py,
which `config check` uses too).

A unit that names a group the root file system lacks fails at start with status 216/GROUP; a
device node it does not allow makes CUDA fail under the unit only (`auto` then serves on the
CPU); an address filter that allows localhost only keeps remote cameras and an MQTT broker
on another machine out. None of these shows when stgcnd runs by hand, so doctor reads the
unit file itself, and its drop-ins (`systemctl edit` writes them), under --root.
"""

from __future__ import annotations

from pathlib import Path

from stgcnd.fsutil import read_system_file
from stgcnd.server.config import Config
from stgcnd.server.unit_filter import (
    EDIT,
    FAIL,
    INSTALLED_UNIT,
    OK,
    PACKAGED_UNIT,
    SKIP,
    Check,
    UnitFile,
    check,
    unit_addresses,
)
from stgcnd_tools.doctor.device_nodes import KNOWN, Node, Unit, describe, nodes_in_use, unit_gaps


def find_unit(root: Path, given: Path | None) -> Path | None:
    """The unit to check: the one named, else the installed one under `root`, else None."""
    if given is not None:
        return given
    installed = root / INSTALLED_UNIT
    return installed if installed.is_file() else None


# --- device nodes ----------------------------------------------------------------------------

def cuda_nodes(root: Path, live: bool, l4t: str | None) -> tuple[list[Node], str]:
    """The nodes CUDA needs, and how they were found: opened by this process (on this
    machine, once CUDA is up), else the known list of the board's L4T release."""
    if live:
        found = nodes_in_use()
        if found:
            return [describe(p) for p in found], "opened by CUDA in this process"
    release = f"R{l4t.split('.')[0]}" if l4t else None
    if release in KNOWN:
        return list(KNOWN[release]), (f"L4T {release}'s known list "
                                      "(stgcnd_tools/doctor/device_nodes.py)")
    return [], ""


def unit_devices(unit: UnitFile, nodes: list[Node], how: str = "") -> Check:
    """Whether the unit lets the daemon open every node CUDA needs."""
    name = "unit: device nodes"
    if not nodes:
        return check(name, SKIP, "no CUDA device node to check (CUDA opened none here, and "
                     "no Jetson release was found)")
    paths = ", ".join(n.path for n in nodes)
    gaps = unit_gaps(Unit.parse(unit.text), nodes)
    if not gaps:
        return check(name, OK, f"{unit.where} allows the {len(nodes)} node(s) CUDA uses "
                     f"({how})" + (f": {paths}" if len(nodes) <= 4 else ""))
    lines = sorted({line for need in gaps.values() for line in need})
    return check(name, FAIL, f"under {unit.where} CUDA could not open {', '.join(sorted(gaps))} "
                 f"({how}): the daemon would serve on the CPU under systemd while it works by "
                 "hand", f"add to the unit's [Service] with {EDIT}: {'; '.join(lines)}; then "
                 "run stgcnd doctor again")


# --- users and groups ------------------------------------------------------------------------

def _names(text: str | None) -> set[str]:
    return {line.split(":", 1)[0] for line in (text or "").splitlines() if ":" in line}


def unit_accounts(unit: UnitFile, root: Path) -> Check:
    """The unit's User=, Group= and SupplementaryGroups= exist in the root's /etc/passwd and
    /etc/group: systemd refuses to start it otherwise (217/USER, 216/GROUP)."""
    name = "unit: user and groups"
    users, groups = _names(read_system_file(root / "etc" / "passwd")), \
        _names(read_system_file(root / "etc" / "group"))
    if not groups:
        return check(name, SKIP, f"{root / 'etc' / 'group'} unreadable")
    user = (unit.values("User") or [""])[-1]
    wanted = [*unit.values("Group")[-1:], *unit.values("SupplementaryGroups")]
    missing = [g for g in dict.fromkeys(wanted) if g not in groups]
    problems, fixes = [], []
    if user and user not in users:
        problems.append(f"User={user} does not exist (the unit would fail with 217/USER)")
        fixes.append(f"sudo useradd --system {user}")
    for group in missing:
        problems.append(f"group {group} does not exist (the unit would fail with 216/GROUP)")
        if group == user:
            continue  # useradd makes the user's own group
        why = {"render": " (JetPack 6's udev rules give the GPU's /dev/dri/renderD* nodes to "
                         "it; on JetPack 5 no node needs it, but the unit names it)"}
        fixes.append(f"sudo groupadd --system {group}{why.get(group, '')}")
    if not problems:
        return check(name, OK, f"User={user or '(root)'}, groups "
                     f"{', '.join(dict.fromkeys(wanted)) or 'none'}: all exist")
    return check(name, FAIL, f"{unit.where}: " + "; ".join(problems),
                 "; ".join(fixes) + ", before the first start (or drop the group from "
                 "SupplementaryGroups= in a drop-in if nothing on this board needs it)")


def unit_checks(unit_path: Path, root: Path, config: Config, live: bool,
                l4t: str | None) -> list[Check]:
    """Every check of the unit at `unit_path` (a missing file is one failed check)."""
    if not unit_path.is_file():
        return [check("unit", FAIL, f"{unit_path} not found",
                      f"sudo install -m 0644 systemd/stgcnd.service /etc/systemd/system/ (or "
                      f"name the unit: stgcnd doctor --unit PATH; the packaged one is "
                      f"{PACKAGED_UNIT})")]
    unit = UnitFile(unit_path)
    nodes, how = cuda_nodes(root, live, l4t)
    return [unit_devices(unit, nodes, how), unit_accounts(unit, root),
            unit_addresses(unit, config, live)]

