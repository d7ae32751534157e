"""A context's optimization profile is set through a call whose refusal raises on every release
line (issue #43, item 1).

`set_optimization_profile_async` is bound with the GIL released on TensorRT 8.5.2 to 10.12: a
refusal there ends the process (SIGSEGV) instead of raising, so JetPack 5 and 6 need another
call. Each case runs the runtime's profile-setting path (`prepare_context`) in a subprocess on
a release's real bindings, with an execution context that fails as that release's binding does
(tests/trt_stubs.py `context_stand_in`): the process must live and say what failed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.trt_stubs import stub_env

SET_PROFILE = r"""
import json, sys
import tensorrt as trt
pretend, profile, in_use = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
if pretend:
    trt.__version__ = pretend  # another release of the same binding line (8.5.2 has no wheel)
from stgcnd.errors import BackendUnavailable
from stgcnd.log import configure_logging
from stgcnd.runtimes import tensorrt_runtime as tb
from tests.trt_stubs import context_stand_in

configure_logging("info", "json")
logger = tb.tensorrt_logger(trt)
Context = context_stand_in(trt, lambda why: logger.log(trt.ILogger.Severity.ERROR, why))
context = Context(profiles=4, in_use=in_use)

class Engine:
    num_optimization_profiles = 4
def make(self, *strategy):
    return context
if hasattr(trt, "ExecutionContextAllocationStrategy"):
    Engine.create_execution_context = make
else:
    Engine.create_execution_context_without_device_memory = make
if hasattr(trt.IExecutionContext, "set_device_memory"):
    Context.set_device_memory = lambda self, a, n: None
else:
    Context.device_memory = property(None, lambda self, a: None)
Context.set_tensor_address = lambda self, name, address: True
try:
    tb.prepare_context(trt, Engine(), profile, 7, 4096, 512, {"input": 1, "output": 2})
    error = None
except BackendUnavailable as exc:
    error = str(exc)
print(json.dumps({"error": error, "calls": context.calls, "profile": context.profile}))
"""

# (bindings, the release they stand for, its line's binding of the profile call)
RELEASES = [("8.6.1", "8.5.2.2"), ("8.6.1", ""), ("10.3.0", ""), ("10.3.0", "10.12.0.36"),
            ("10.16.1.11", ""), ("11.4.0.106", "")]


def set_profile(bindings: str, pretend: str, profile: int, in_use: list[int]
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SET_PROFILE, pretend, str(profile),
                           json.dumps(in_use)], capture_output=True, text=True, timeout=120,
                          env=stub_env(bindings), cwd=REPO)


def result(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, (
        f"the process died (rc {proc.returncode}): a refused profile must raise, not end "
        f"the daemon\n{proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("bindings", "pretend"), RELEASES)
def test_a_profile_is_set(bindings, pretend):
    res = result(set_profile(bindings, pretend, 2, []))
    assert res["error"] is None and res["profile"] == 2
    kind = res["calls"][0][0]
    # 8.x: the property's setter (the async call would die on a refusal); 10.x: the async
    # call (the property is read-only there).
    assert kind == ("setter" if bindings.startswith("8.") else "async"), res["calls"]


@pytest.mark.parametrize("pretend", ["8.5.2.2", ""])
def test_a_profile_in_use_on_8x_is_an_error_not_a_crash(pretend):
    res = result(set_profile("8.6.1", pretend, 1, [1]))
    text = res["error"]
    assert text is not None and "optimization profile 1" in text and "8.x" in text
    # TensorRT's own reason inside stgcnd's one error line.
    assert "profile 1 is in use by another context" in text
    assert "Error in set optimization profile" in text


@pytest.mark.parametrize(("bindings", "pretend"), RELEASES)
def test_a_profile_the_engine_lacks_is_an_error_on_every_release(bindings, pretend):
    res = result(set_profile(bindings, pretend, 7, []))
    assert res["error"] is not None and "optimization profile 7" in res["error"]
    assert "4 profile(s)" in res["error"]
    assert res["calls"] == []  # never asked: on 10.0-10.12 the async call would end the process


def test_the_stand_in_dies_where_the_binding_does():
    """The stand-in is what makes the tests above able to fail: the async call refused on an
    8.5.2-10.12 binding ends the process, as the real one does."""
    probe = (
        "import tensorrt as trt, sys\n"
        "trt.__version__ = sys.argv[1] or trt.__version__\n"
        "from tests.trt_stubs import context_stand_in\n"
        "context_stand_in(trt)(profiles=4).set_optimization_profile_async(9, 0)\n")
    for bindings, pretend, dies in (("8.6.1", "8.5.2.2", True), ("10.3.0", "10.12.0.36", True),
                                    ("10.16.1.11", "", False)):
        proc = subprocess.run([sys.executable, "-c", probe, pretend], capture_output=True,
                              text=True, timeout=120, env=stub_env(bindings), cwd=REPO)
        if dies:
            assert proc.returncode < 0, proc.stderr[-500:]
        else:
            assert proc.returncode == 1 and "RuntimeError" in proc.stderr
