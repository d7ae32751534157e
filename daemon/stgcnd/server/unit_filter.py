"""The systemd unit's address filter against the configuration's peers: read by `config
check` (a broker off this machine that the unit would keep out) and by `stgcnd doctor`'s unit
checks (stgcnd_tools/doctor/unit.py), from the unit file itself and its drop-ins
(`systemctl edit` writes them).

An address filter that allows localhost only keeps remote cameras and an MQTT broker on
another machine out; that never shows when stgcnd runs by hand.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any, Dict, Union

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
