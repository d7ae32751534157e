"""Every command's --help: each option and argument is described and shows its default."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from stgcnd.cli import build_parser
from tests.conftest import REPO


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    found = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}")

    walk(build_parser(), "stgcnd")
    return found


PARSERS = _all_parsers()


@pytest.mark.parametrize(("name", "parser"), PARSERS, ids=[n for n, _ in PARSERS])
def test_every_option_is_described_with_its_default(name, parser):
    problems = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                               argparse._SubParsersAction)):
            continue
        label = "/".join(action.option_strings) or action.dest
        text = action.help or ""
        if not text.strip() or text == argparse.SUPPRESS:
            problems.append(f"{label}: no description")
            continue
        trivial = action.default in (None, False, True, [], argparse.SUPPRESS)
        if action.option_strings and not trivial and "default" not in text.lower():
            problems.append(f"{label}: default {action.default!r} not shown")
    assert not problems, f"`{name} --help`: " + "; ".join(problems)


def test_demo_help_as_a_user_sees_it():
    proc = subprocess.run([sys.executable, "-m", "stgcnd", "demo", "--help"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for option, default in (("--cameras", "4"), ("--duration", "20"), ("--mode", "push"),
                            ("--fps", "25")):
        after = text.split(f"{option} ", 2)[-1]
        assert f"(default: {default})" in after.split(" --")[0], option


def test_build_help_says_which_tensorrt_builds_qdq_int8():
    """8.5 (JetPack 5) builds the Q/DQ ONNX as INT8 (its parser imports QuantizeLinear /
    DequantizeLinear; builders/tensorrt.py's precision_plan): the help must not send a
    JetPack 5 user away with ">= 8.6"."""
    (build,) = [p for n, p in PARSERS if n == "stgcnd build"]
    (mode,) = [a for a in build._actions if "--int8-mode" in a.option_strings]
    assert "8.6" not in (mode.help or "") and "8.5" in (mode.help or "")


def test_the_tools_commands_come_from_their_package(stgcnd_main):
    """The daemon names no tool (tests/test_layers.py); the tools package declares its
    commands and `stgcnd` lists them where the daemon's own list says nothing of them."""
    from stgcnd.cli import COMMANDS
    from stgcnd_tools import COMMANDS as TOOL_COMMANDS

    listed = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert set(TOOL_COMMANDS) <= set(listed) and not set(TOOL_COMMANDS) & set(COMMANDS)
    order = list(listed)
    for name, (_module, after) in TOOL_COMMANDS.items():
        assert order.index(name) == order.index(after) + 1, name
    assert stgcnd_main("demo", "--help").returncode == 0


def test_without_the_tools_package_stgcnd_serves_and_says_how_to_install_them(stgcnd_main,
                                                                              monkeypatch):
    monkeypatch.setitem(sys.modules, "stgcnd_tools", None)  # as where it is not installed
    listing = stgcnd_main("--help")
    text = " ".join(listing.stdout.split())
    assert listing.returncode == 0 and " serve " in text and " demo " not in text
    assert "not installed here" in text and "`pip install .`" in text
    for command, argv in (("demo", ["demo"]),
                          ("loadtest", ["--log-level", "debug", "loadtest", "--help"])):
        missing = stgcnd_main(*argv)
        assert missing.returncode == 2 and "Traceback" not in missing.stderr
        assert f"'{command}' is not a command of the daemon" in missing.stderr
        assert "`pip install .`" in missing.stderr
    assert stgcnd_main("config", "keys").returncode == 0
