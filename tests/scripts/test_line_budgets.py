"""scripts/line_budgets.py: every line budget with its headroom, counted as the tests count,
and --update setting each to its measure + 3 % without losing a comment."""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess

import pytest

from tests import test_layers

SCRIPT = test_layers.REPO / "scripts" / "line_budgets.py"
BUDGETS = test_layers.REPO / "tests" / "test_layers.py"


@pytest.fixture
def run(capsys):
    """The script's main in this process (it counts with this same test_layers)."""
    spec = importlib.util.spec_from_file_location("line_budgets", SCRIPT)
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def call(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = script.main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return call


def values(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^(MAX_\w+_LINES) = (\d+)$", text, re.M)}


def test_the_table_shows_what_the_tests_count(run):
    proc = run()
    counts = test_layers.line_counts()
    rows = {m[0]: (int(m[1].replace(",", "")), int(m[2].replace(",", "")))
            for m in re.findall(r"^(MAX_\w+_LINES)\s+([\d,]+)\s+([\d,]+)", proc.stdout, re.M)}
    assert rows == {name: (counts[name], getattr(test_layers, name)) for name in counts}
    over = any(counts[name] > getattr(test_layers, name) for name in counts)
    assert proc.returncode == (1 if over else 0), proc.stderr
    assert ("OVER by" in proc.stdout) == over


def test_update_sets_each_to_its_measure_plus_3_percent_and_keeps_the_comments(tmp_path, run):
    # the budgets' file without the lines an earlier --update wrote (which it replaces)
    original = re.sub(r"^# Set by scripts/line_budgets.py.*\n(?:#   .*\n)*", "",
                      BUDGETS.read_text(), flags=re.M)
    copy = tmp_path / "test_layers.py"
    low = re.sub(r"^(MAX_\w+_LINES) = \d+$", r"\1 = 10", original, flags=re.M)
    copy.write_text(low)

    refused = run("--update", "--file", str(copy))  # every budget would rise: why?
    assert refused.returncode == 1 and "--why" in refused.stderr and copy.read_text() == low

    assert run("--update", "--why", "grew for a test", "--file", str(copy)).returncode == 0
    raised = copy.read_text()
    counts = test_layers.line_counts()
    assert values(raised) == {n: math.ceil(c * 1.03) for n, c in counts.items()}
    comments = [line for line in original.splitlines() if line.startswith("#")]
    assert all(line in raised.splitlines() for line in comments)
    assert raised.count("(grew for a test).") == len(counts)
    assert max(len(line) for line in raised.splitlines()) <= 100  # ruff's line length

    # Falling needs no reason; a second update replaces the line it wrote, never adds one.
    copy.write_text(re.sub(r"^(MAX_\w+_LINES) = \d+$", r"\1 = 999999", raised, flags=re.M))
    assert run("--update", "--file", str(copy)).returncode == 0
    lowered = copy.read_text()
    assert values(lowered) == values(raised)
    assert lowered.count("# Set by scripts/line_budgets.py") == len(counts)
    assert "grew for a test" not in lowered
    assert len(lowered.splitlines()) == len(raised.splitlines())
