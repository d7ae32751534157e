"""The TensorRT runner's one shared activation buffer (runtimes/tensorrt_runtime.py):
`activation_bytes`, `context_without_memory` and `give_memory`, first on stand-ins that have
one or another release's names, then on the names each release's real bindings have (8.6:
whole-engine size, its own factory, the device_memory property; 10.x: per-profile sizes, an
allocation strategy, set_device_memory; 11.x: only the _v2 sizes)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from stgcnd.errors import BackendUnavailable
from stgcnd.runtimes.tensorrt_runtime import (
    activation_bytes,
    context_without_memory,
    give_memory,
)
from tests.conftest import REPO
from tests.trt_stubs import VERSIONS, stub_env

MiB = 2**20


class PerProfileEngine:
    """10.x: per-profile sizes (a larger one for the larger bucket's profile)."""

    def __init__(self) -> None:
        self.sizes = {0: 3 * MiB, 1: 5 * MiB, 2: 9 * MiB, 3: 17 * MiB}
        self.asked: list[tuple[str, int]] = []

    def get_device_memory_size_for_profile(self, p: int) -> int:
        self.asked.append(("v1", p))
        return self.sizes[p]

    def get_device_memory_size_for_profile_v2(self, p: int) -> int:
        self.asked.append(("v2", p))
        return self.sizes[p]

    device_memory_size = 1 * MiB       # the whole engine's figure: never used when per-profile
    device_memory_size_v2 = 2 * MiB    # sizes exist


def test_activation_bytes_is_the_largest_profile_of_the_runner():
    engine = PerProfileEngine()
    assert activation_bytes(engine, [0, 2]) == 9 * MiB
    assert activation_bytes(engine, [0, 1, 2, 3]) == 17 * MiB
    assert activation_bytes(engine, [1]) == 5 * MiB
    assert {name for name, _ in engine.asked} == {"v2"}   # the _v2 name first (64-bit sizes)


def test_activation_bytes_falls_back_to_what_the_release_has():
    class V1Only:      # a 10.x before the _v2 names
        def get_device_memory_size_for_profile(self, p):
            return [4, 6][p]

    assert activation_bytes(V1Only(), [0, 1]) == 6
    # 8.x: no per-profile figure; the whole engine's (the largest profile's) size.
    assert activation_bytes(SimpleNamespace(device_memory_size=123), [0, 3]) == 123
    assert activation_bytes(SimpleNamespace(device_memory_size=1, device_memory_size_v2=7),
                            [0]) == 7
    with pytest.raises(BackendUnavailable, match="no device memory size"):
        activation_bytes(SimpleNamespace(), [0])


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def create_execution_context(self, *args):
        self.calls.append(("create_execution_context", *args))
        return "context"

    def create_execution_context_without_device_memory(self):
        self.calls.append(("create_execution_context_without_device_memory",))
        return "context without memory"


def test_context_without_memory_by_strategy_or_by_factory():
    strategy = SimpleNamespace(STATIC=0, ON_PROFILE_CHANGE=1, USER_MANAGED=2)
    engine = Recorder()
    assert context_without_memory(SimpleNamespace(ExecutionContextAllocationStrategy=strategy),
                                  engine) == "context"
    assert engine.calls == [("create_execution_context", 2)]
    engine = Recorder()
    assert context_without_memory(SimpleNamespace(), engine) == "context without memory"
    assert engine.calls == [("create_execution_context_without_device_memory",)]


def test_give_memory_by_call_or_by_property():
    class Ten:
        def __init__(self):
            self.got = None

        def set_device_memory(self, address, nbytes):
            self.got = (address, nbytes)

    ten = Ten()
    give_memory(ten, 0xDEAD0000, 9 * MiB)
    assert ten.got == (0xDEAD0000, 9 * MiB)
    eight = SimpleNamespace(device_memory=None)
    give_memory(eight, 0xBEEF0000, 9 * MiB)
    assert eight.device_memory == 0xBEEF0000


# --- against each release's real bindings ----------------------------------------------------

RELEASE = """
import json
import tensorrt as trt
from stgcnd.runtimes import tensorrt_runtime as tb

# Stand-ins with exactly those of the helpers' candidate names that this release's classes
# have; each answer says which name answered.
ENGINE = ("get_device_memory_size_for_profile_v2", "get_device_memory_size_for_profile",
          "device_memory_size_v2", "device_memory_size",
          "create_execution_context_without_device_memory")
used = []

def method(name):
    def call(self, *args):
        used.append([name, *[getattr(a, "name", a) for a in args]])
        return 1000 + (args[0] if args and isinstance(args[0], int) else 0)
    return call

attrs = {}
for name in ENGINE:
    if hasattr(trt.ICudaEngine, name):
        attrs[name] = (method(name) if not name.startswith("device_memory_size")
                       else {"device_memory_size": 100, "device_memory_size_v2": 200}[name])
attrs["create_execution_context"] = method("create_execution_context")
Engine = type("Engine", (), attrs)

class Context:
    pass
if hasattr(trt.IExecutionContext, "set_device_memory"):
    Context.set_device_memory = method("set_device_memory")
context = Context()

nbytes = tb.activation_bytes(Engine(), [0, 3, 1])
made = tb.context_without_memory(trt, Engine())
strategy = used[-1][1:] if used[-1][0] == "create_execution_context" else None
tb.give_memory(context, 4096, 512)
doc = trt.ICudaEngine.create_execution_context.__doc__ or ""
setter = getattr(trt.IExecutionContext, "device_memory", None)
print(json.dumps({
    "version": trt.__version__, "bytes": nbytes, "used": used,
    "property": getattr(context, "device_memory", None),
    "strategies": sorted(m for m in dir(getattr(trt, "ExecutionContextAllocationStrategy", ()))
                         if m.isupper()),
    "factory_takes_strategy": "strategy: tensorrt.tensorrt.ExecutionContextAllocationStrategy"
                              in doc,
    "set_device_memory_doc": (getattr(trt.IExecutionContext, "set_device_memory", None)
                              and trt.IExecutionContext.set_device_memory.__doc__) or "",
    "device_memory_settable": isinstance(setter, property) and setter.fset is not None,
}))
"""


@pytest.fixture(scope="module", params=VERSIONS)
def release(request) -> tuple[str, dict]:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RELEASE)],
                          capture_output=True, text=True, timeout=120,
                          env=stub_env(request.param), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return request.param, json.loads(proc.stdout.strip().splitlines()[-1])


def test_each_release_gets_the_names_it_has(release):
    version, res = release
    assert res["version"].startswith(version)
    used = [call[0] for call in res["used"]]
    if version.startswith("8."):
        # The whole engine's size (no per-profile figure in 8.6), the 8.x factory, and the
        # device_memory property (a real setter in the bindings).
        assert res["bytes"] == 100
        assert used == ["create_execution_context_without_device_memory"]
        assert res["property"] == 4096 and res["device_memory_settable"]
        assert res["strategies"] == []
    else:
        # Per profile, by the _v2 name (10.x has both names, 11.x only _v2): the largest of
        # the runner's profiles; a context made with the USER_MANAGED strategy, which this
        # release's create_execution_context really takes; memory given with its size.
        assert res["bytes"] == 1003
        assert used[:3] == ["get_device_memory_size_for_profile_v2"] * 3
        assert res["used"][3] == ["create_execution_context", "USER_MANAGED"]
        assert res["factory_takes_strategy"]
        assert "USER_MANAGED" in res["strategies"]
        assert res["used"][4] == ["set_device_memory", 4096, 512]
        assert "memory" in res["set_device_memory_doc"] and "size" in res["set_device_memory_doc"]
        assert res["property"] is None
    assert len(used) == (1 if version.startswith("8.") else 5)
