"""scripts/check_jetson_deps.py: the pip dependency set resolves to aarch64 wheels for the
Pythons of JetPack 5 (3.8) and 6 (3.10). It downloads ~100 MB from PyPI, so it runs only with
TEST_NET=1 (its recorded output is in docs/jetson.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "check_jetson_deps.py"


def test_markers_pick_one_numpy_per_python():
    """Offline: the pyproject markers give Python 3.8 a numpy with 3.8 wheels (< 1.25)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import check_jetson_deps as deps
    finally:
        sys.path.pop(0)
    reqs = deps.requirements(REPO / "pyproject.toml")
    for python, want in (("3.8", "<1.25"), ("3.10", None), ("3.12", None)):
        numpy = [got[1] for r in reqs if (got := deps.applies(r, python))
                 and got[0] == "numpy"]
        assert len(numpy) == 1, (python, numpy)
        assert (want in numpy[0]) if want else "<" not in numpy[0]
    assert deps.applies("tomli>=2.0; python_version < '3.11'", "3.12") is None


@pytest.mark.skipif(os.environ.get("TEST_NET") != "1",
                    reason="downloads from PyPI; set TEST_NET=1")
def test_dependency_set_resolves_for_jetpack_pythons():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--python", "3.8", "3.10"],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all resolve" in proc.stdout
    assert "numpy-1.24." in proc.stdout and "cp38" in proc.stdout
