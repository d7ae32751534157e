"""CONTRIBUTING.md names the rules the tests enforce: every test and file it names exists (a
renamed test or a moved file leaves no stale pointer), and every test of the house's own
shape (tests/test_layers.py) is named there, with the way to put it right."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

TEXT = (REPO / "CONTRIBUTING.md").read_text()


def defined_tests() -> set[str]:
    return {node.name for path in (REPO / "tests").rglob("test_*.py")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_test_and_file_it_names_exists():
    named = set(re.findall(r"(?<![/\w])(test_\w+)\b(?!\.py)", TEXT))  # not a file's name
    assert named and not named - defined_tests(), sorted(named - defined_tests())
    paths = set(re.findall(r"`((?:tests|daemon|clients|tools|scripts|systemd|docs)/[\w./-]+?)"
                           r"(?:::\w+)?`", TEXT))
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert paths and not missing, missing


def test_every_rule_of_the_layers_is_named():
    tree = ast.parse((REPO / "tests" / "test_layers.py").read_text())
    rules = {node.name for node in tree.body
             if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    assert not [r for r in sorted(rules) if r not in TEXT], "name it in CONTRIBUTING.md"
