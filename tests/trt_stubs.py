"""The real Python bindings of a TensorRT release, importable without TensorRT's libraries.

`../shared/tensorrt/stub-bindings.sh VERSION DIR` downloads a release's bindings wheel for the
running interpreter and builds stand-in libraries whose factories return NULL (nothing can
run, every class, enum and signature is the release's own). Prepared once per release *and
Python version* (the bindings are compiled for one interpreter: the tests also run on 3.8);
a release with no wheel for this interpreter, or no network, skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO.parent / "shared" / "tensorrt" / "stub-bindings.sh"
CACHE = Path(os.environ.get("TEST_TRT_STUB_CACHE", Path.home() / ".cache" / "stgcnd-trt-stubs"))
# JetPack 6.0's 8.6 line, JetPack 6.1/6.2's 10.3, a current 10.x and 11.x. TensorRT 8.5
# (JetPack 5) has no bindings wheel on the package index: its surface is covered by 8.6.1 plus
# feature detection (see OPTIONAL_API and docs/jetson.md).
VERSIONS = ("8.6.1", "10.3.0", "10.16.1.11", "11.4.0.106")


def stub_env(version: str) -> dict[str, str]:
    """os.environ plus the bindings of `version` and this repository on the paths."""
    if not SCRIPT.is_file():
        pytest.skip(f"{SCRIPT} not found (the shared folder beside the repository)")
    out = CACHE / f"{version}-py{sys.version_info[0]}{sys.version_info[1]}"
    try:
        proc = subprocess.run(["bash", str(SCRIPT), version, str(out)], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})
    except subprocess.TimeoutExpired:
        pytest.skip(f"preparing TensorRT {version} bindings timed out")
    if proc.returncode != 0:
        pytest.skip(f"cannot prepare TensorRT {version} bindings for Python "
                    f"{sys.version_info[0]}.{sys.version_info[1]} (no wheel, or no network): "
                    f"{proc.stderr.strip()[-300:]}")
    env = dict(os.environ)
    lib, site = out / "lib", out / "site"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), env.get("LD_LIBRARY_PATH"))
                                             if p)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), str(REPO / "daemon"), str(REPO), env.get("PYTHONPATH")) if p)
    return env
