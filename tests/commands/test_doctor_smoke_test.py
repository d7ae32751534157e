"""`stgcnd doctor --smoke-test`'s TensorRT check against a stand-in `tensorrt` module that
implements just the calls it makes, and a stand-in device whose memory is host arrays.

The stand-in engine computes what the network it was given says (the activation type added
with add_input / add_activation / mark_output), reading and writing the device memory at the
addresses the context was given: a check that built the wrong network, bound the wrong
buffers, skipped a copy or compared with the wrong answer fails here. Each TensorRT line's
network flags are the release's own (tensorrt/api-*.txt; 8.5.2's python/src/infer/pyCore.cpp
in NVIDIA/TensorRT): EXPLICIT_BATCH before 10.x, none in 10.x, STRONGLY_TYPED in 11.x.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from stgcnd_tools.doctor.checks import SMOKE_SHAPE, tensorrt_smoke_test

RELU, SIGMOID = "RELU", "SIGMOID"


class FakeDevice:
    """Device memory as host arrays at made-up addresses."""

    def __init__(self) -> None:
        self.memory: dict[int, np.ndarray] = {}
        self.streams: list[int] = []
        self.uploads = self.downloads = 0
        self.closed = False
        self._next = 0x7F0000000000

    def stream(self) -> int:
        self.streams.append(0x1000 + len(self.streams))
        return self.streams[-1]

    def zeros(self, nbytes: int, stream: int) -> int:
        assert stream in self.streams
        self._next += 0x10000
        self.memory[self._next] = np.zeros(nbytes, np.uint8)
        return self._next

    def pinned(self, shape, dtype) -> np.ndarray:
        return np.zeros(shape, dtype)

    def upload(self, address: int, host: np.ndarray) -> None:
        self.uploads += 1
        self.memory[address][:] = np.frombuffer(np.ascontiguousarray(host).tobytes(), np.uint8)

    def download(self, host: np.ndarray, address: int, stream: int) -> None:
        assert stream in self.streams
        self.downloads += 1
        host[...] = self.memory[address].view(host.dtype).reshape(host.shape)

    def close(self) -> None:
        self.closed = True


class FakeLogger:
    def __init__(self) -> None:
        self.errors: list[str] = []

    @property
    def error_count(self) -> int:
        return len(self.errors)

    def errors_since(self, mark: int) -> list[str]:
        return self.errors[mark:]


def fake_tensorrt(version: str, device: FakeDevice, flags: dict[str, int],
                  fp16: bool = True, broken: str | None = None) -> SimpleNamespace:
    """A `tensorrt` module with the calls the smoke test makes. `broken`: "identity" (the
    engine ignores its activation), "build" (no engine), "execute" (execute_async_v3 says
    False)."""
    record: dict = {"created": [], "network": None}

    class Tensor:
        def __init__(self, name: str) -> None:
            self.name = name

    class Layer:
        def __init__(self, out: Tensor) -> None:
            self.out = out

        def get_output(self, index: int) -> Tensor:
            assert index == 0
            return self.out

    class Network:
        def __init__(self) -> None:
            self.inputs: list[tuple] = []
            self.ops: list[tuple] = []
            self.outputs: list[Tensor] = []

        def add_input(self, name, dtype, shape):
            assert dtype == "FLOAT"
            tensor = Tensor(name)
            self.inputs.append((tensor, tuple(shape)))
            return tensor

        def add_activation(self, tensor, kind):
            out = Tensor(f"({kind} {tensor.name})")
            self.ops.append((kind, tensor, out))
            return Layer(out)

        def mark_output(self, tensor):
            self.outputs.append(tensor)

    class Config:
        pool = None

        def set_memory_pool_limit(self, pool, size):
            self.pool = (pool, size)

    class Builder:
        def __init__(self, logger):
            self.logger = logger

        def create_network(self, flags=0):
            record["created"].append(flags)
            record["network"] = Network()
            return record["network"]

        def create_builder_config(self):
            return Config()

        def build_serialized_network(self, network, config):
            if broken == "build":
                self.logger.errors.append("[optimizer] no implementation for layer (RELU x)")
                return None
            (inp, shape), = network.inputs
            (kind, src, out), = network.ops
            assert src is inp and network.outputs == [out]
            return json.dumps({"input": inp.name, "output": out.name, "shape": shape,
                               "kind": kind}).encode()

    class Context:
        def __init__(self, plan: dict) -> None:
            self.plan = plan
            self.addresses: dict[str, int] = {}

        def set_tensor_address(self, name, address):
            if name not in (self.plan["input"], self.plan["output"]):
                return False
            self.addresses[name] = address
            return True

        def execute_async_v3(self, stream_handle):
            assert stream_handle in device.streams
            if broken == "execute":
                return False
            shape = tuple(self.plan["shape"])
            x = device.memory[self.addresses[self.plan["input"]]].view(np.float32)
            y = np.maximum(x, 0) if self.plan["kind"] == RELU and broken != "identity" else x
            out = device.memory[self.addresses[self.plan["output"]]]
            out[:] = np.frombuffer(y.reshape(shape).tobytes(), np.uint8)
            return True

    class Engine:
        def __init__(self, plan: dict) -> None:
            self.plan = plan

        def create_execution_context(self):
            return Context(self.plan)

    class Runtime:
        def __init__(self, logger):
            self.logger = logger

        def deserialize_cuda_engine(self, plan):
            return Engine(json.loads(bytes(plan)))

    builder_flags = {"FP16": 0, "INT8": 1} if fp16 else {"TF32": 0}
    return SimpleNamespace(
        __version__=version, Builder=Builder, Runtime=Runtime,
        NetworkDefinitionCreationFlag=SimpleNamespace(**flags),
        BuilderFlag=SimpleNamespace(**builder_flags),
        DataType=SimpleNamespace(FLOAT="FLOAT"),
        ActivationType=SimpleNamespace(RELU=RELU, SIGMOID=SIGMOID),
        MemoryPoolType=SimpleNamespace(WORKSPACE="WORKSPACE"), record=record)


RELEASES = {
    # release: (network creation flags, FP16/INT8 builder flags, create_network's argument)
    "8.5.2.2": ({"EXPLICIT_BATCH": 0, "EXPLICIT_PRECISION": 1}, True, 1 << 0),
    "10.3.0": ({"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1}, True, 0),
    "11.4.0.106": ({"STRONGLY_TYPED": 1, "PREFER_AOT_PYTHON_PLUGINS": 2}, False, 1 << 1),
}


@pytest.mark.parametrize("version", list(RELEASES))
def test_smoke_test_passes_on_a_working_tensorrt(version):
    flags, fp16, expected_flags = RELEASES[version]
    device = FakeDevice()
    trt = fake_tensorrt(version, device, flags, fp16)
    got = tensorrt_smoke_test(trt, device=device, logger=FakeLogger())
    assert got["status"] == "ok", got
    assert got["name"] == "tensorrt smoke test" and got["fix"] is None
    assert got["detail"].startswith(f"TensorRT {version}: built a one-layer ReLU engine")
    assert got["detail"].endswith("output matches")
    assert trt.record["created"] == [expected_flags]
    network = trt.record["network"]
    assert [shape for _, shape in network.inputs] == [(1, 3, 4, 4)] == [SMOKE_SHAPE]
    assert [kind for kind, _, _ in network.ops] == [RELU]
    assert device.uploads == 1 and device.downloads == 1 and device.closed


def test_wrong_output_fails():
    """An engine whose ReLU lets negative values through: the check must see it."""
    device = FakeDevice()
    trt = fake_tensorrt("8.5.2.2", device, RELEASES["8.5.2.2"][0], broken="identity")
    got = tensorrt_smoke_test(trt, device=device, logger=FakeLogger())
    assert got["status"] == "fail"
    negatives = int(np.count_nonzero(np.arange(48) - 20.5 < 0))
    assert got["detail"] == (f"TensorRT 8.5.2.2: the engine ran, but {negatives} of 48 outputs "
                             "differ from ReLU's (largest difference 20.5)")
    assert "sudo apt install --reinstall tensorrt python3-libnvinfer" in got["fix"]
    assert device.closed


def test_a_build_failure_quotes_tensorrt():
    device = FakeDevice()
    logger = FakeLogger()
    trt = fake_tensorrt("10.3.0", device, RELEASES["10.3.0"][0], broken="build")
    got = tensorrt_smoke_test(trt, device=device, logger=logger)
    assert got["status"] == "fail"
    assert got["detail"] == ("TensorRT 10.3.0: the builder made no engine of a one-layer "
                             "network (TensorRT said: [optimizer] no implementation for layer "
                             "(RELU x))")
    assert device.closed


def test_a_refused_execution_fails():
    device = FakeDevice()
    trt = fake_tensorrt("10.3.0", device, RELEASES["10.3.0"][0], broken="execute")
    got = tensorrt_smoke_test(trt, device=device, logger=FakeLogger())
    assert got["status"] == "fail"
    assert got["detail"] == "TensorRT 10.3.0: execute_async_v3 refused to run"
    assert device.downloads == 0 and device.closed


def test_an_exception_is_a_failure_not_a_traceback():
    class NoCuda(FakeDevice):
        def zeros(self, nbytes, stream):
            raise RuntimeError("CUDA error: cuMemAlloc failed with CUresult 2")

    device = NoCuda()
    trt = fake_tensorrt("8.5.2.2", device, RELEASES["8.5.2.2"][0])
    got = tensorrt_smoke_test(trt, device=device, logger=FakeLogger())
    assert got["status"] == "fail"
    assert got["detail"] == ("TensorRT 8.5.2.2: RuntimeError: CUDA error: cuMemAlloc failed "
                             "with CUresult 2")
    assert device.closed


def test_the_stand_in_really_checks_the_network():
    """The stand-in engine computes what it was built with: a sigmoid network would not match
    ReLU's answer, so the smoke test's pass above depends on it building ReLU."""
    device = FakeDevice()
    trt = fake_tensorrt("8.5.2.2", device, RELEASES["8.5.2.2"][0])
    trt.ActivationType = SimpleNamespace(RELU=SIGMOID)  # the check asks for RELU, gets this
    got = tensorrt_smoke_test(trt, device=device, logger=FakeLogger())
    assert got["status"] == "fail" and "outputs differ from ReLU's" in got["detail"]


@pytest.mark.gpu
def test_smoke_test_through_the_real_driver_layer():
    """Everything but TensorRT for real: the check's own DriverDevice (primary context, a
    stream, zeroed device memory, pinned host arrays, the copies through runtimes/cuda.py).
    The stand-in engine reads its input from the GPU, applies ReLU on the host and writes its
    output back to the GPU with plain driver copies. Run on the GPU test machine."""
    import ctypes

    from stgcnd.runtimes import gpu_present

    if not gpu_present():
        pytest.skip("needs a CUDA GPU")
    lib = ctypes.CDLL("libcuda.so.1")
    dtoh, htod = lib.cuMemcpyDtoH_v2, lib.cuMemcpyHtoD_v2
    dtoh.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    htod.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]

    trt = fake_tensorrt("10.3.0", FakeDevice(), RELEASES["10.3.0"][0])
    context_class = trt.Runtime(None).deserialize_cuda_engine(json.dumps(
        {"input": "x", "output": "y", "shape": SMOKE_SHAPE, "kind": RELU}).encode()
    ).create_execution_context().__class__

    def execute_on_gpu(self, stream_handle):
        x = np.empty(SMOKE_SHAPE, np.float32)
        assert dtoh(x.ctypes.data, self.addresses["x"], x.nbytes) == 0
        y = np.ascontiguousarray(np.maximum(x, 0))
        assert htod(self.addresses["y"], y.ctypes.data, y.nbytes) == 0
        return True

    context_class.execute_async_v3 = execute_on_gpu
    got = tensorrt_smoke_test(trt, logger=FakeLogger())
    assert got["status"] == "ok", got
    # An engine that writes nothing leaves the zeroed output: the positive half differs.
    context_class.execute_async_v3 = lambda self, stream: True
    got = tensorrt_smoke_test(trt, logger=FakeLogger())
    assert got["status"] == "fail" and "27 of 48 outputs differ" in got["detail"], got
