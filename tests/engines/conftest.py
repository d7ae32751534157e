"""Engine store fixtures: a small demo model (T=8) built once, copied per test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# T does not matter to the store; short windows keep the tests fast (each build validates the
# export and the artefact against the fp32 reference, whose cost grows with T).
FRAMES = 8


def demo_spec(**kw):
    from stgcnd.model.spec import ModelSpec

    return ModelSpec(frames=FRAMES, **kw)


@pytest.fixture(scope="session")
def seed_store(tmp_path_factory) -> Path:
    """An engine store with the demo model's ONNX and ONNX Runtime fp32 artefact."""
    from stgcnd.engines.options import BuildOptions
    from stgcnd.engines.store import EngineStore

    root = tmp_path_factory.mktemp("seed") / "engines"
    EngineStore(root).prepare(demo_spec(), "onnxruntime", BuildOptions())
    return root


@pytest.fixture
def store_root(seed_store, tmp_path) -> Path:
    root = tmp_path / "engines"
    shutil.copytree(seed_store, root)
    return root


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120,
               preexec_fn=None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with JSON logs on stderr."""
    prelude = ("from stgcnd.log import configure_logging\n"
               "configure_logging('info', 'json')\n")
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})},
                          preexec_fn=preexec_fn, cwd=REPO)


def events(stderr: str) -> list[dict]:
    out = []
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def named(stderr: str, name: str) -> list[dict]:
    return [e for e in events(stderr) if e.get("event") == name]


PREPARE = """
from pathlib import Path
from stgcnd.engines.options import BuildOptions
from stgcnd.model.spec import ModelSpec
from tests.engines.pausing_store import PausingStore
a = PausingStore(Path({root!r})).prepare(ModelSpec(frames={frames}), "onnxruntime",
                                        BuildOptions(), rebuild={rebuild!r})
print(a.path, a.reused, a.reason)
"""


def prepare_code(root: Path, rebuild: str | None = None) -> str:
    return PREPARE.format(root=str(root), frames=FRAMES, rebuild=rebuild)
