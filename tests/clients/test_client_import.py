"""The client package must install and import without the daemon's heavy dependencies."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

CLIENTS_DIR = Path(__file__).resolve().parents[2] / "clients"


def test_imports_without_torch_or_the_daemon():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['stgcnd'] = None\n"
        "import stgcnd_client, stgcnd_client.protocol, stgcnd_client.window\n"
        "assert stgcnd_client.Client and stgcnd_client.SkeletonWindow\n"
        "heavy = {'torch', 'onnx', 'onnxruntime', 'tensorrt', 'structlog', 'psutil'}\n"
        "loaded = heavy & {m.split('.')[0] for m, v in sys.modules.items() if v is not None}\n"
        "assert not loaded, loaded\n"
        "print(stgcnd_client.__file__)\n"
    )
    # Run from the source tree so the package's own __init__ is what gets imported.
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=CLIENTS_DIR, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == CLIENTS_DIR / "stgcnd_client" / "__init__.py"


def test_standalone_distribution_depends_only_on_pyzmq_msgspec_numpy():
    meta = tomllib.loads((CLIENTS_DIR / "pyproject.toml").read_text(encoding="utf-8"))
    project = meta["project"]
    assert project["name"] == "stgcnd-client"
    names = {re.split(r"[<>=!~;\[ ]", dep)[0] for dep in project["dependencies"]}
    assert names == {"pyzmq", "msgspec", "numpy", "typing_extensions"}


def test_neither_the_daemon_nor_the_client_loads_msgpack_python():
    """msgpack goes through msgspec only (issue #44): serving, the client's calls and its
    events load no second msgpack library (msgpack-python is a test dependency, the fuzz
    tests' independent oracle)."""
    code = ("import sys, stgcnd.commands.serve, stgcnd.server.events, stgcnd_client.wire, "
            "stgcnd_client.events, stgcnd_client.client; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'msgpack'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
