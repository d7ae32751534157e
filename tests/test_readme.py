"""Every code block in README.md runs as written, or says why not and is checked for sense.

Each fenced block follows a marker comment:
  <!-- ci: ... -->       lines that .ci/run runs as written (checked here), and the stgcnd
                         commands among them are run here too (`stgcnd demo`, for real);
  <!-- run: ... -->      a Python program run here against a real demo daemon (its endpoint
                         as the first argument);
  <!-- subscriber: ... --> an events subscriber, run against a real daemon (and broker)
                         by tests/server/test_doc_examples.py;
  <!-- not-run: why -->  cannot run here (systemd, a user's checkpoint, the suite itself): the
                         shell must parse it, every `stgcnd` command in it must parse with the
                         real CLI, and files it names must exist.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

README = REPO / "README.md"
BLOCK = re.compile(r"^<!-- (ci|run|not-run|subscriber)(?::[^>]*)? -->\n```(\w+)\n(.*?)^```",
                   re.M | re.S)


@dataclass(frozen=True)
class Block:
    kind: str
    lang: str
    code: str


def blocks() -> list[Block]:
    return [Block(*m.groups()) for m in BLOCK.finditer(README.read_text())]


def commands(code: str) -> list[str]:
    """Shell command lines: continuations joined, comments and blank lines dropped."""
    joined = code.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def stgcnd_argv(line: str) -> list[list[str]]:
    """The argument lists of the `stgcnd` commands in a line (after pipes too)."""
    out = []
    for part in line.split("|"):
        words = shlex.split(part)
        if words and words[0] == "stgcnd":
            out.append(words[1:])
    return out


def test_every_block_has_a_marker():
    fences = len(re.findall(r"^```", README.read_text(), re.M))
    assert fences % 2 == 0 and len(blocks()) == fences // 2, \
        "a fenced block in README.md has no <!-- ci/run/not-run --> marker before it"
    assert {b.kind for b in blocks()} == {"ci", "run", "not-run", "subscriber"}


def test_quick_start_is_two_commands_and_ci_runs_them_as_written():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    quick = next(b for b in blocks() if b.kind == "ci")
    assert commands(quick.code) == ['pip install -e ".[dev]"', "stgcnd demo"]
    for block in (b for b in blocks() if b.kind == "ci"):
        for line in commands(block.code):
            assert line in ci, f".ci/run does not run the README's {line!r} as written"
    assert "python -m pytest -q" in ci


def test_no_python_310_claim_and_jetson_doc_linked():
    text = README.read_text()
    assert ">= 3.10" not in text and "3.8" in text
    assert "docs/jetson.md" in text


@pytest.mark.parametrize("block", [b for b in blocks() if b.lang == "bash"],
                         ids=lambda b: commands(b.code)[0][:40])
def test_shell_blocks_parse_and_their_stgcnd_commands_too(block):
    r = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    from stgcnd.cli import build_parser

    for line in commands(block.code):
        for argv in stgcnd_argv(line):
            try:
                build_parser().parse_args(argv)
            except SystemExit as exc:
                pytest.fail(f"README command `stgcnd {' '.join(argv)}` does not parse "
                            f"(exit {exc.code})")
        for word in shlex.split(line):
            if word.startswith(("systemd/", "docs/")):
                assert (REPO / word).exists(), f"README names {word}, which does not exist"


def test_python_blocks_compile():
    for block in (b for b in blocks() if b.lang == "python"):
        compile(block.code, "README.md", "exec")


def _env(tmp_path: Path) -> dict[str, str]:
    paths = [str(REPO / "daemon"), str(REPO / "clients"), os.environ.get("PYTHONPATH", "")]
    # The default engine store goes under the (temporary) user cache, not the checkout.
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
            "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}


@contextmanager
def _daemon(tmp_path: Path, config_text: str) -> Iterator[str]:
    """A real `stgcnd serve` on `config_text`, ready; yields its endpoint; stopped after,
    and must have exited 0."""
    from stgcnd_tools.daemon import DaemonProcess

    config = tmp_path / "daemon.toml"
    config.write_text(config_text)
    endpoint = f"ipc://{tmp_path / 'stgcnd.sock'}"
    with DaemonProcess(config, tmp_path / "daemon.log", endpoint=endpoint,
                       engines=tmp_path / "engines", env=_env(tmp_path), cwd=tmp_path) as daemon:
        daemon.wait_ready(300)
        yield endpoint
    assert daemon.returncode == 0


def _run_the_camera_example(tmp_path: Path, endpoint: str) -> None:
    """Every `run` Python block of the README, as written, against `endpoint`: it exits 0
    and prints the 3 predictions of its 200 frames."""
    runnable = [b for b in blocks() if b.kind == "run" and b.lang == "python"]
    assert runnable, "the README's camera example is not marked runnable"
    for i, block in enumerate(runnable):
        script = tmp_path / f"camera{i}.py"
        script.write_text(block.code)
        r = subprocess.run([sys.executable, str(script), endpoint], capture_output=True,
                           text=True, timeout=300, env=_env(tmp_path), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        predictions = [ln for ln in r.stdout.splitlines()
                       if ln.split(" ")[0] in ("normal", "abnormal")]
        assert len(predictions) == 3, r.stdout  # frames 150, 175, 200 at stride 25
        assert "compute_ms" in predictions[0]


@pytest.mark.slow
def test_python_blocks_run_against_a_demo_daemon(tmp_path):
    from stgcnd_tools.commands.demo import demo_config

    with _daemon(tmp_path, demo_config()) as endpoint:
        _run_the_camera_example(tmp_path, endpoint)


@pytest.mark.slow
def test_the_camera_example_passes_when_a_load_doubles_the_compute_time(tmp_path):
    """#32.3: the camera example's 5 s default timeout holds a model of 0.8 s a window; under
    a CPU load that doubles that, a window takes 1.6 s, still well inside 5 s. The daemon here
    serves the `noop` backend at 1.6 s a window: the demo model computes in tens of ms on this
    machine, so no CPU hog would bring it near the timeout, and the noop's device time is what
    the daemon's estimate sees. It used to fail: the first attempt was given a quarter of the
    timeout (1.25 s), the daemon answered it `expired`, and that ended the call."""
    config = ('[server]\nwarmup_runs = 1\n\n[[models]]\nname = "demo"\ndemo = true\n'
              'backend = "noop"\nnoop_compute_us = 1600000\nmax_batch = 1\nbuckets = [1]\n'
              'stride = 25\nlabels = ["normal", "abnormal"]\n')
    with _daemon(tmp_path, config) as endpoint:
        _run_the_camera_example(tmp_path, endpoint)


@pytest.mark.slow
def test_shell_blocks_marked_run_run_as_written(tmp_path):
    pytest.importorskip("torch")  # `stgcnd example` writes a torch.save checkpoint
    runnable = [b for b in blocks() if b.kind == "run" and b.lang == "bash"]
    assert runnable, "the README's example/validate block is not marked runnable"
    bin_dir = tmp_path / "bin"  # `stgcnd` as this Python runs it, first on PATH
    bin_dir.mkdir()
    (bin_dir / "stgcnd").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m stgcnd "$@"\n')
    (bin_dir / "stgcnd").chmod(0o755)
    env = {**_env(tmp_path), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for i, block in enumerate(runnable):
        work = tmp_path / f"block{i}"
        work.mkdir()
        r = subprocess.run(["bash", "-e", "-c", block.code], capture_output=True, text=True,
                           timeout=600, env=env, cwd=work)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert "passed" in r.stdout and "top-1 agreement" in r.stdout


@pytest.mark.slow
def test_quick_start_demo_runs_as_written(tmp_path):
    for block in (b for b in blocks() if b.kind == "ci"):
        for line in commands(block.code):
            for argv in stgcnd_argv(line):
                r = subprocess.run([sys.executable, "-m", "stgcnd", *argv], capture_output=True,
                                   text=True, timeout=600, env=_env(tmp_path), cwd=tmp_path)
                assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
                assert "start-up took" in r.stderr and "cam4" in r.stdout
