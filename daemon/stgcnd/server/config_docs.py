"""The configuration's documentation, made from its schema (server/config.py): the annotated
example (`stgcnd config example`, systemd/stgcnd.toml) and the README's key table."""

from __future__ import annotations

import textwrap
from typing import Any

from stgcnd.server.config import (
    EventsConfig,
    EventsSection,
    KeyDoc,
    ModelConfig,
    MqttConfig,
    ServerConfig,
    schema,
)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, 92, initial_indent="# ", subsequent_indent="# ")


def _tag(meta: KeyDoc, form: str) -> str:
    """How the generated documentation marks what a reload does with a key (policy: no mark)."""
    return "" if meta.applies == "policy" else " " + form.format(meta.applies)


def example() -> str:
    """The annotated configuration: every key with its doc and default (the defaults of the
    example's own values where it sets them: a systemd deployment serving a checkpoint)."""
    shown = {"endpoint": "ipc:///run/stgcnd/stgcnd.sock",
             "engines_dir": "/var/lib/stgcnd/engines", "keys_dir": "/var/lib/stgcnd/keys",
             "socket_mode": 0o660}
    model = {"name": "single", "checkpoint": "/var/lib/stgcnd/models/epoch60_model.pt",
             "labels": ("normal", "shoplifting"), "precision": "fp16", "stride": 25}
    out = ["# /etc/stgcnd/stgcnd.toml - stgcnd daemon configuration (annotated example; "
           "`stgcnd config",
           "# example` prints it). Every [server] key can be overridden by an environment",
           "# variable STGCND_<KEY> (e.g. STGCND_STATS_INTERVAL=5). Unknown keys, and unknown",
           "# STGCND_* variables, are errors. Keys marked (engine) are what models are built",
           "# and loaded from: a reload (SIGHUP) that changes one loads the model anew",
           "# ([server]: every model). Keys marked (restart) take effect at a restart only (a",
           "# reload that changes one logs reload_key_ignored). A reload applies every other key",
           "# at once. A relative path (checkpoint, calibration, engines_dir) is relative to the",
           "# file's directory.", "",
           "[server]"]
    for name, default, meta in schema(ServerConfig):
        out += _comment(meta.description + _tag(meta, "({})"))
        value = shown.get(name, default)
        if value is None:
            out.append(f"# {name} = ")
        elif name == "socket_mode":
            out.append(f"{name} = 0o{value:o}")
        else:
            out.append(f"{name} = {_toml_value(value)}")
    out += ["", "[[models]]"]
    for name, default, meta in schema(ModelConfig):
        if name == "events":
            continue  # its own table, below
        out += _comment(meta.description + _tag(meta, "({})"))
        value = model.get(name, default)
        out.append(f"# {name} = " if value is None else f"{name} = {_toml_value(value)}")
    out += ["", "# Action events from this model's predictions (docs/protocol.md, Events): "
            "uncomment", "# the table to turn them on.", "# [models.events]"]
    for name, default, meta in schema(EventsConfig):
        if name in ("classes", "cameras"):
            continue
        out += _comment(meta.description)
        sample = ("normal",) if name == "quiet_classes" else default  # not left blank
        out.append(f"# {name} = {_toml_value(sample)}")
    out += ["# One class's thresholds, one camera's overrides:",
            "# [models.events.classes.shoplifting]", "# enter = 0.9",
            "# [models.events.cameras.door-1]", "# cooldown_s = 120.0"]
    out += ["", "# The events on an MQTT broker too (docs/protocol.md, Events over MQTT): "
            "uncomment the", "# table to turn it on. Its keys take effect at a restart.",
            "# [events.mqtt]"]
    for name, default, meta in schema(MqttConfig):
        out += _comment(meta.description)
        sample = {"broker": "mqtts://broker.example:8883", "username": "stgcnd",
                  "password_file": "/etc/stgcnd/mqtt.password"}.get(name, default)
        out.append(f"# {name} = " if sample is None else f"# {name} = {_toml_value(sample)}")
    return "\n".join(out) + "\n"


def key_table() -> str:
    """The README's list of keys, as a markdown table made from the schema."""
    rows = ["| key | default | what |", "| --- | --- | --- |"]
    for section, cls in (("server", ServerConfig), ("models", ModelConfig),
                         ("models.events", EventsConfig), ("events", EventsSection),
                         ("events.mqtt", MqttConfig)):
        for name, default, meta in schema(cls):
            shown = "unset" if default is None else _toml_value(default)
            tag = _tag(meta, "*{}*")
            rows.append(f"| `[{section}] {name}` | `{shown}` | {meta.description}{tag} |")
    return "\n".join(rows) + "\n"
