"""The plain retained topics made from a camera's retained state (server/mqtt_sink.py;
docs/protocol.md, "Events over MQTT", "Topics without templates"): what Home Assistant and
Node-RED read as they are, without a JSON template.

- PREFIX/CAMERA/class/CLASS: `ON` while an event of the class is open on the camera, else
  `OFF`, for every class of the state's `classes`: those its models watch, announced at its
  first request (server/event_hub.py), and every one it has had an event of;
- PREFIX/CAMERA/feed: the feed's health state (`ok`, `low-visibility`, ...), from its first
  request on (the state the feed's health starts at, until it says another);
- with [events.mqtt] discovery, Home Assistant's discovery configs for them.

They are a function of the state alone (`plain_topics`), so there is one way to make them
true: whatever makes a state true (a change, the repair at a start or a session-less
connection, server/mqtt_retained.py) makes these true with it, and a state removed (a camera
gone) removes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import unquote

from stgcnd import __version__
from stgcnd.server.feed_health import OK, STATES

ON, OFF = b"ON", b"OFF"  # Home Assistant's binary sensor defaults (payload_on/payload_off)
ONLINE, OFFLINE = "online", "offline"  # ... and its availability defaults
FEED_STATES = (OK, *STATES)

# Characters a topic level cannot carry as they are: the level separator, the wildcards, and
# what brokers refuse in a topic as malformed UTF-8 (NUL, the other control characters and
# the Unicode non-characters: Mosquitto cuts the connection, and the message that caused it
# would be resent into the same cut at every reconnect); and % itself. A camera id is written
# with these escaped as in a URL, each byte of their UTF-8 as %XX (%2F for /, %C2%85 for U+85).
_UNSAFE = "%/+#" + "".join(map(chr, [
    *range(0x20), *range(0x7F, 0xA0), *range(0xFDD0, 0xFDF0),
    *(plane + last for plane in range(0, 0x110000, 0x10000) for last in (0xFFFE, 0xFFFF))]))
_ESCAPE = str.maketrans({c: "".join(f"%{b:02X}" for b in c.encode()) for c in _UNSAFE})
_ID_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def topic_level(name: str) -> str:
    return name.translate(_ESCAPE)


def level_name(level: str) -> str:
    """The name `topic_level` wrote as `level` (its inverse: every % in a level escapes)."""
    return unquote(level)


def ha_id(name: str) -> str:
    """`name` in Home Assistant's id characters ([a-zA-Z0-9_-]): every other character, and
    `_` itself, as `_XX` for each byte of its UTF-8. Deterministic and one-to-one, and `__`
    never occurs in the result, so ids joined with `__` stay one-to-one too."""
    return "".join(c if c in _ID_SAFE else "".join(f"_{b:02X}" for b in c.encode())
                   for c in name)


def classes_of(state: Mapping[str, object]) -> list[str]:
    """The classes a state says the camera has had events of: its `classes`, its open
    events' and its last message's (a state of an older daemon has no `classes`)."""
    found = set(c for c in _list(state.get("classes")) if isinstance(c, str))
    for message in [*_list(state.get("open")), state.get("last")]:
        if isinstance(message, dict) and message.get("kind") in ("start", "end") and \
                isinstance(message.get("class"), str):
            found.add(message["class"])
    return sorted(found)


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


class Discovery:
    """Home Assistant MQTT discovery ([events.mqtt] discovery). What its documentation says
    (home-assistant.io/integrations/mqtt, "MQTT Discovery"; .../binary_sensor.mqtt and
    .../sensor.mqtt, read for this): a retained config on
    DISCOVERY_PREFIX/COMPONENT/NODE/OBJECT/config, NODE and OBJECT only of [a-zA-Z0-9_-];
    an empty retained config deletes the entity; `state_topic` is the one field a binary
    sensor or sensor requires; `unique_id` makes the entity editable and survive restarts,
    and `device` (needs `identifiers` or `connections`) groups the entities; `object_id` is
    deprecated since 2025.10 (ignored from 2026.4) for `default_entity_id` (DOMAIN.NAME);
    `availability_topic` with `payload_available`/`payload_not_available` (defaults
    online/offline) shows the entities unavailable while the daemon is not; a binary sensor's
    `payload_on`/`payload_off` default to ON/OFF; a sensor with `device_class: enum` takes
    its `options`. One device per camera (its binary sensor per class, its feed sensor);
    no device_class for the binary sensors: a class is any label (fall, loitering, ...),
    and none of Home Assistant's binary sensor classes fits every one."""

    def __init__(self, prefix: str, node: str, status_topic: str) -> None:
        self.prefix, self.node, self.status_topic = prefix, ha_id(node), status_topic
        # Every config of this node (this daemon): read back at a sync, to withdraw them
        # where discovery was turned off.
        self.filter = f"{prefix}/+/{self.node}/+/config"

    def is_mine(self, topic: str) -> bool:
        """Whether `topic` is a config of this node (as `filter` matches it)."""
        if not topic.startswith(self.prefix + "/"):
            return False
        parts = topic[len(self.prefix) + 1:].split("/")
        return len(parts) == 4 and parts[1] == self.node and parts[3] == "config"

    def configs(self, camera: str, level: str, classes: list[str]) -> dict[str, bytes]:
        """Topic -> config of the camera's entities (its topics: PREFIX/`level`/...)."""
        cam = ha_id(camera)
        device = {"identifiers": [f"{self.node}__{cam}"], "name": camera,
                  "model": "stgcnd camera", "manufacturer": "stgcnd",
                  "sw_version": __version__}
        common = {"availability_topic": self.status_topic, "payload_available": ONLINE,
                  "payload_not_available": OFFLINE, "device": device}
        out: dict[str, bytes] = {}
        for cls in classes:  # unique ids of four parts, the feed's of three: never the same
            uid = f"{self.node}__{cam}__class__{ha_id(cls)}"
            out[f"{self.prefix}/binary_sensor/{self.node}/{cam}__class__{ha_id(cls)}/config"] \
                = _json({"name": cls, "unique_id": uid,
                         "default_entity_id": f"binary_sensor.{uid.lower()}",
                         "state_topic": f"{level}/class/{topic_level(cls)}",
                         "payload_on": ON.decode(), "payload_off": OFF.decode(), **common})
        uid = f"{self.node}__{cam}__feed"
        out[f"{self.prefix}/sensor/{self.node}/{cam}__feed/config"] = _json({
            "name": "feed", "unique_id": uid, "default_entity_id": f"sensor.{uid.lower()}",
            "state_topic": f"{level}/feed", "device_class": "enum",
            "options": list(FEED_STATES), "icon": "mdi:cctv", **common})
        return out


def plain_topics(level: str, state: Mapping[str, object],
                 discovery: Discovery | None) -> dict[str, bytes]:
    """Topic -> retained payload of every plain topic of a camera's `state`, whose topics
    are under `level` (PREFIX/CAMERA)."""
    opened = {e.get("class") for e in _list(state.get("open")) if isinstance(e, dict)}
    classes = classes_of(state)
    out = {f"{level}/class/{topic_level(c)}": ON if c in opened else OFF for c in classes}
    feed = state.get("feed")
    if isinstance(feed, str):
        out[f"{level}/feed"] = feed.encode()
    camera = state.get("camera")
    if discovery is not None and isinstance(camera, str):
        out.update(discovery.configs(camera, level, classes))
    return out


def _json(body: Mapping[str, object]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
