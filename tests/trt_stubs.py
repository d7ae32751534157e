"""The real Python bindings of a TensorRT release, importable without TensorRT's libraries.

`../shared/tensorrt/stub-bindings.sh VERSION DIR` downloads a release's bindings wheel for the
running interpreter and builds stand-in libraries whose factories return NULL (nothing can
run, every class, enum and signature is the release's own). Prepared once per release *and
Python version* (the bindings are compiled for one interpreter: the tests also run on 3.8);
a release with no wheel for this interpreter, or no network, skips.

The stub bindings cannot run anything: an execution context is a stand-in
(`context_stand_in`) that answers as the release's binding does, down to how it fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

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


# TensorRT binds `set_optimization_profile_async` with the GIL released (pyCore.cpp:
# `py::call_guard<py::gil_scoped_release>`) from 8.5.2 to 10.12; its refusal then sets a Python
# error without a thread state and the process dies with SIGSEGV. 10.13 dropped the GIL release
# (issue #43: a review of the 8.5.2, 8.6.1, 10.3, 10.12 and 10.13 binding sources).
ASYNC_PROFILE_GIL_RELEASED = ((8, 5, 2), (10, 13))  # [first release, first without)


def release(version: str) -> tuple[int, ...]:
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in version.split("."))


def context_stand_in(trt: Any, log: Callable[[str], None] | None = None) -> type:
    """An execution context class for the release `trt` is (its real bindings, possibly with
    `__version__` set to another release of the same line), answering a profile as that
    release's binding does:

    - a profile out of range is refused on every release; a profile in use by another context
      (`in_use`) only on 8.x (10.x shares profiles between contexts by default);
    - TensorRT logs its reason (`log`) before the call answers;
    - `set_optimization_profile_async` refused: on 8.5.2-10.12 the process dies (SIGSEGV, as
      the real binding does), later a RuntimeError;
    - `active_optimization_profile` has a setter (raising RuntimeError on a refusal) exactly
      where the release's binding has one (8.x; read-only from 10.0).
    """
    version = release(trt.__version__)
    first, fixed = ASYNC_PROFILE_GIL_RELEASED
    dies = first <= version < fixed
    shares = version >= (10,)
    has_setter = trt.IExecutionContext.active_optimization_profile.fset is not None

    class Context:
        def __init__(self, profiles: int = 4, in_use: tuple[int, ...] = ()) -> None:
            self.profiles, self.in_use = profiles, set(in_use)
            self.profile = 0
            self.calls: list[list[Any]] = []

        def _accepts(self, profile: int) -> bool:
            if not 0 <= profile < self.profiles:
                why = f"profile index {profile} is out of range"
            elif profile in self.in_use and not shares:
                why = f"profile {profile} is in use by another context"
            else:
                self.profile = profile
                return True
            if log is not None:
                log(why)
            return False

        def set_optimization_profile_async(self, profile: int, stream: int) -> bool:
            self.calls.append(["async", profile, stream])
            if self._accepts(profile):
                return True
            if dies:  # PyErr_SetString with the GIL released
                os.kill(os.getpid(), signal.SIGSEGV)
            raise RuntimeError("Error in set optimization profile async.")

        def _set(self, profile: int) -> None:
            self.calls.append(["setter", profile])
            if not self._accepts(profile):
                raise RuntimeError("Error in set optimization profile.")

        active_optimization_profile = property(
            lambda self: self.profile, _set if has_setter else None)

    return Context
