#!/usr/bin/env python3
"""Show that stgcnd's pip dependencies resolve to binary wheels on a Jetson's Python.

For each target (Python 3.8 = JetPack 5, 3.10 = JetPack 6, 3.12 = JetPack 7; all aarch64),
every requirement in pyproject.toml that applies there (its environment marker evaluated
for that Python) is fetched with

    pip download --python-version X.Y --platform manylinux2014_aarch64
                 --platform manylinux_2_28_aarch64 --only-binary=:all: --no-deps REQ

Packages that come from JetPack (tensorrt) or from NVIDIA's
JetPack wheel index (torch) are not pip's to resolve there and are skipped. Exit status 1 if
any requirement has no wheel. manylinux_2_28 is glibc 2.28, older than every JetPack's
Ubuntu (20.04 has 2.31), so such wheels install there.

    python scripts/check_jetson_deps.py [--python 3.8 3.10] [--dest DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_28_aarch64")
NOT_FROM_PYPI = {"tensorrt": "JetPack (apt)",
                 "torch": "NVIDIA's JetPack wheel, only to build from a checkpoint"}
EXTRAS = ("onnxruntime",)   # extras a Jetson install may use, besides the core set


def requirements(pyproject: Path) -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[no-redef]
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    return reqs


def applies(requirement: str, python: str) -> tuple[str, str] | None:
    """(name, requirement without its marker) if it applies to `python` on aarch64 Linux."""
    from packaging.requirements import Requirement

    req = Requirement(requirement)
    env = {"python_version": python, "python_full_version": f"{python}.0",
           "platform_machine": "aarch64", "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    if req.marker is not None and not req.marker.evaluate(env):
        return None
    return req.name.lower(), f"{req.name}{req.specifier}"


def download(spec: str, python: str, dest: Path) -> tuple[bool, str]:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q",
           "--python-version", python, *(a for p in PLATFORMS for a in ("--platform", p)),
           "--only-binary=:all:", "--no-deps", "-d", str(dest), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.splitlines() if x.startswith("ERROR")]
        return False, (lines[0] if lines else proc.stderr.strip()[-200:])
    return True, ""


def wheel_for(name: str, dest: Path) -> str:
    norm = re.sub(r"[-_.]+", "_", name).lower()
    found = sorted(p.name for p in dest.glob("*.whl")
                   if re.sub(r"[-_.]+", "_", p.name.split("-")[0]).lower() == norm)
    return found[-1] if found else "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", nargs="+", default=["3.8", "3.10"])
    p.add_argument("--dest", type=Path, default=None, help="keep the wheels here")
    args = p.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for python in args.python:
            dest = (args.dest or Path(tmp)) / f"py{python}"
            dest.mkdir(parents=True, exist_ok=True)
            print(f"Python {python} / aarch64 ({', '.join(PLATFORMS)}):")
            for requirement in requirements(REPO / "pyproject.toml"):
                got = applies(requirement, python)
                if got is None:
                    continue
                name, spec = got
                if name in NOT_FROM_PYPI:
                    print(f"  {spec:<34} skipped: from {NOT_FROM_PYPI[name]}")
                    continue
                ok, why = download(spec, python, dest)
                failed += not ok
                print(f"  {spec:<34} {wheel_for(name, dest) if ok else 'NO WHEEL: ' + why}")
    print("all resolve" if not failed else f"{failed} requirement(s) without a wheel")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
