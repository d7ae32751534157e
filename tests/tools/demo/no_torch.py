"""Run stgcnd subprocesses as on a machine where torch is not installed.

A `sitecustomize.py` on PYTHONPATH puts None in sys.modules["torch"] before anything runs, so
every `import torch` in that process (and the processes it starts with this environment)
raises ModuleNotFoundError, and importlib.util.find_spec("torch") answers None, as when the
package is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import REPO

BLOCKER = ('import sys\n'
           'sys.modules["torch"] = None  # tests: behave as if torch were not installed\n')


def no_torch_env(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "no-torch-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    paths = [str(site), str(REPO / "daemon"), str(REPO / "clients"),
             os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
