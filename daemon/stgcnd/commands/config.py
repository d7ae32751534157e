"""`stgcnd config example|check|keys`: the configuration schema, for people and for review.

`check` runs the checks `serve` runs before it loads anything (server/config_checks.py), with
the environment's overrides, and prints the resolved configuration or the daemon's own error,
so an edit can be checked before `systemctl reload stgcnd`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from stgcnd.server.config import Config, load_config
from stgcnd.server.config_checks import check_config
from stgcnd.server.config_docs import example, key_table
from stgcnd.server.model_files import labels_problems
from stgcnd.server.unit_filter import (
    INSTALLED_UNIT,
    OK,
    PACKAGED_UNIT,
    UnitFile,
    peers,
    unit_addresses,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "config", help="print the annotated example configuration, or check a file",
        description="The daemon's configuration: an annotated example made from its schema, "
                    "the list of keys, or a check of a file.")
    sub = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    sub.add_parser("example", help="the annotated example (what systemd/stgcnd.toml holds)",
                   ).set_defaults(func=lambda args: _print(example()))
    sub.add_parser("keys", help="every key, its default and meaning, as a markdown table",
                   ).set_defaults(func=lambda args: _print(key_table()))
    check = sub.add_parser(
        "check", help="check a configuration file as the daemon would read it",
        description="Read FILE (default: $STGCND_CONFIG, else /etc/stgcnd/stgcnd.toml, else "
                    "the built-in defaults), apply STGCND_* variables, run the checks "
                    "`stgcnd serve` runs before it loads anything (files the models name, "
                    "endpoints, CURVE, each model's backend and precision on this machine), "
                    "and print the resolved configuration as JSON; what only loading the "
                    "models can tell is listed on stderr. Exit status 2 with the daemon's "
                    "error when it would refuse it.")
    check.add_argument("file", nargs="?", type=Path, metavar="FILE",
                       help="the file to check (default: where the daemon would look)")
    check.set_defaults(func=run_check)


def _print(text: str) -> int:
    sys.stdout.write(text)
    return 0


def run_check(args: argparse.Namespace) -> int:
    config = load_config(args.file)
    not_checked = check_config(config, read_files=labels_problems)
    resolved = msgspec.to_builtins(config)
    resolved["endpoint"] = config.endpoint
    resolved["engines_dir"] = str(config.engines_dir)
    print(json.dumps(resolved, indent=2))
    print(f"{config.source}: the checks `stgcnd serve` runs before loading passed. Not "
          "checked without loading the models:", file=sys.stderr)
    for line in not_checked:
        print(f"  - {line}", file=sys.stderr)
    for line in _unit_warnings(config):
        print(f"warning: {line}", file=sys.stderr)
    return 0


def _unit_warnings(config: Config) -> list[str]:
    """A broker off this machine that the systemd unit's address filter (the installed one,
    else the shipped one: IPAddressDeny=any, localhost allowed) would keep out: the daemon
    started by hand reaches it, under systemd it never connects. doctor's own check, not
    resolving names (a broker named by host name is said unsure)."""
    if not any(what.startswith("the MQTT") for what, _, _ in peers(config, live=False)):
        return []
    installed = Path("/") / INSTALLED_UNIT
    unit = UnitFile(installed if installed.is_file() else PACKAGED_UNIT)
    result = unit_addresses(unit, config, live=False)
    return [] if result["status"] == OK else [f"{result['detail']}; {result['fix']}"]
