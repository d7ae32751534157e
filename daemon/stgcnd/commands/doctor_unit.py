"""`stgcnd doctor`'s checks of the systemd unit, before its first start: what it lets the
daemon open (device nodes), run as (users and groups that must exist) and reach (its address
filter against the configuration's endpoints and MQTT broker). Each missing line is named,
with where to put it.

A unit that names a group the root file system lacks fails at start with status 216/GROUP; a
device node it does not allow makes CUDA fail under the unit only (`auto` then serves on the
CPU); an address filter that allows localhost only keeps remote cameras and an MQTT broker
on another machine out. None of these shows when stgcnd runs by hand, so doctor reads the
unit file itself, and its drop-ins (`systemctl edit` writes them), under --root.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any, Dict, Union

from stgcnd.device_nodes import KNOWN, Node, Unit, describe, nodes_in_use, unit_gaps
from stgcnd.fsutil import read_system_file
from stgcnd.server.config import Config

FAIL, OK, SKIP, WARN = "fail", "ok", "skip", "warn"
INSTALLED_UNIT = "etc/systemd/system/stgcnd.service"
PACKAGED_UNIT = Path(__file__).resolve().parents[3] / "systemd" / "stgcnd.service"
EDIT = "sudo systemctl edit stgcnd (a drop-in under /etc/systemd/system/stgcnd.service.d/)"
Check = Dict[str, Any]  # typing.Dict: evaluated at run time, and 3.8 has no dict[...]
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
# systemd's names for address sets (systemd.resource-control(5), IPAddressAllow=).
KEYWORDS = {"any": ("0.0.0.0/0", "::/0"), "localhost": ("127.0.0.0/8", "::1/128"),
            "link-local": ("169.254.0.0/16", "fe80::/64"),
            "multicast": ("224.0.0.0/4", "ff00::/8")}


def check(name: str, status: str, detail: str, fix: str | None = None) -> Check:
    return {"name": name, "status": status, "detail": detail, "fix": fix}


class UnitFile:
    """A unit file with its drop-ins (`NAME.d/*.conf`, in name order, each after the unit)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        dropins = path.with_name(path.name + ".d")
        self.dropins = sorted(dropins.glob("*.conf")) if dropins.is_dir() else []
        self.text = "\n".join(read_system_file(p) or "" for p in [path, *self.dropins])
        self.devices = Unit.parse(self.text)

    def values(self, key: str) -> list[str]:
        """Every word `key=` gives, in order; an empty assignment resets the list."""
        out: list[str] = []
        for raw in self.text.splitlines():
            line = raw.strip()
            if line.startswith(("#", ";")) or "=" not in line:
                continue
            name, value = (s.strip() for s in line.split("=", 1))
            if name == key:
                out = out + value.split() if value else []
        return out

    @property
    def where(self) -> str:
        return str(self.path) + (f" (+ {len(self.dropins)} drop-in(s))" if self.dropins else "")


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
        return list(KNOWN[release]), f"L4T {release}'s known list (stgcnd/device_nodes.py)"
    return [], ""


def unit_devices(unit: UnitFile, nodes: list[Node], how: str = "") -> Check:
    """Whether the unit lets the daemon open every node CUDA needs."""
    name = "unit: device nodes"
    if not nodes:
        return check(name, SKIP, "no CUDA device node to check (CUDA opened none here, and "
                     "no Jetson release was found)")
    paths = ", ".join(n.path for n in nodes)
    gaps = unit_gaps(unit.devices, nodes)
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


# --- the address filter ----------------------------------------------------------------------

def networks(words: list[str]) -> list[Network]:
    out: list[Network] = []
    for word in words:
        for item in KEYWORDS.get(word, (word,)):
            try:
                out.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                continue  # a word systemd knows and we do not: not counted either way
    return out


def admits(allow: list[Network], deny: list[Network], address: Any) -> bool:
    """systemd's rule: an address IPAddressAllow= matches is allowed; else one that
    IPAddressDeny= matches is refused; else allowed."""
    def within(nets: list[Network]) -> bool:
        return any(address.version == n.version and address in n for n in nets)

    return within(allow) or not within(deny)


def _resolve(host: str, live: bool) -> list[Any]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    if host == "localhost":
        return [ipaddress.ip_address("127.0.0.1")]
    if not live:
        return []
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def peers(config: Config, live: bool) -> list[tuple[str, str, list[Any]]]:
    """(what, host, its addresses) of every peer off this machine the daemon talks to: the
    cameras of a tcp endpoint bound off loopback (any address: '*'), the MQTT broker."""
    out: list[tuple[str, str, list[Any]]] = []
    for endpoint in dict.fromkeys(e for e in (config.endpoint, config.server.events_endpoint)
                                  if e and e.startswith("tcp://")):
        host = endpoint[len("tcp://"):].rsplit(":", 1)[0]
        if host in ("*", "0.0.0.0", "::", "[::]"):
            out.append((f"cameras on {endpoint}", host, []))
            continue
        addresses = [a for a in _resolve(host, live) if not a.is_loopback]
        if addresses:
            out.append((f"cameras on {endpoint}", host, addresses))
    if config.events.mqtt is not None and config.events.mqtt.broker:
        host = config.events.mqtt.address[0]
        addresses = _resolve(host, live)
        if not addresses or not all(a.is_loopback for a in addresses):
            out.append((f"the MQTT broker {config.events.mqtt.broker}", host, addresses))
    return out


def unit_addresses(unit: UnitFile, config: Config, live: bool) -> Check:
    name = "unit: address filter"
    allow, deny = networks(unit.values("IPAddressAllow")), networks(unit.values("IPAddressDeny"))
    said = (f"IPAddressDeny={' '.join(unit.values('IPAddressDeny')) or '(none)'}, "
            f"IPAddressAllow={' '.join(unit.values('IPAddressAllow')) or '(none)'}")
    off_loopback = [n for n in allow if not n.is_loopback and n.prefixlen > 0]
    problems, lines = [], []
    unsure = []
    for what, host, addresses in peers(config, live):
        if not addresses and host in ("*", "0.0.0.0", "::", "[::]"):
            # Cameras from any machine: the filter must let some network off this one in.
            if not off_loopback and not admits(allow, deny, ipaddress.ip_address("192.0.2.1")):
                problems.append(f"{what}: the unit lets in no address off this machine")
                lines.append("IPAddressAllow=<your cameras' network, e.g. 10.0.0.0/24>")
            continue
        if not addresses:
            unsure.append(f"{what}: {host} does not resolve here; the unit must allow its "
                          "address")
            continue
        refused = [a for a in addresses if not admits(allow, deny, a)]
        if refused:
            problems.append(f"{what}: the unit refuses {', '.join(map(str, refused))}")
            for a in refused:
                net = ipaddress.ip_network(f"{a}/{24 if a.version == 4 else 64}", strict=False)
                lines.append(f"IPAddressAllow={a}" if what.startswith("the MQTT")
                             else f"IPAddressAllow={net} (the cameras' network)")
    if problems:
        return check(name, FAIL, f"{unit.where} ({said}): " + "; ".join(problems),
                     f"add to the unit's [Service] with {EDIT}: "
                     + "; ".join(dict.fromkeys(lines)))
    if unsure:
        return check(name, WARN, f"{said}; " + "; ".join(unsure),
                     f"add IPAddressAllow=ADDRESS with {EDIT}")
    return check(name, OK, f"{said}: lets in every peer the configuration names"
                 if peers(config, live) else f"{said}; the configuration talks to no peer "
                 "off this machine (ipc or loopback endpoints, no remote broker)")


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

