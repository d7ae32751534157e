"""CUresults shown to users are named, and a batch whose calls fail reports the first failure
(issue #43, item 5): or-ing the results of several calls names an error none of them returned
(1 | 2 is 3, CUDA_ERROR_NOT_INITIALIZED).

The driver is a stand-in (this machine has no GPU): every entry point the batch path binds,
each answering a scripted CUresult; cuGetErrorName answers as libcuda does.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import pytest

from stgcnd.errors import BackendUnavailable
from stgcnd.runtimes import cuda, cuda_batch

NAMES = {1: b"CUDA_ERROR_INVALID_VALUE", 2: b"CUDA_ERROR_OUT_OF_MEMORY",
         3: b"CUDA_ERROR_NOT_INITIALIZED", 100: b"CUDA_ERROR_NO_DEVICE"}


class Driver:
    """libcuda's entry points as plain functions (ctypes' `argtypes` can be set on them)."""

    def __init__(self) -> None:
        self.fail: dict[str, int] = {}

        def entry(name: str):  # type: ignore[no-untyped-def]
            def call(*args: object) -> int:
                return self.fail.get(name, 0)
            return call

        for name in ("cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuEventRecord",
                     "cuStreamWaitEvent", "cuEventQuery", "cuEventSynchronize",
                     "cuEventElapsedTime", "cuEventCreate", "cuEventDestroy_v2",
                     "cuStreamSynchronize", "cuStreamDestroy_v2", "cuMemFree_v2",
                     "cuMemFreeHost", "cuCtxSetCurrent", "cuDeviceGet",
                     "cuDevicePrimaryCtxRetain", "cuInit", "cuStreamCreate", "cuMemAlloc_v2",
                     "cuMemsetD8Async", "cuMemHostAlloc", "cuMemcpyHtoD_v2"):
            setattr(self, name, entry(name))

    def cuGetErrorName(self, status: ctypes.c_int, out: object) -> int:
        name = NAMES.get(status.value)
        if name is None:
            return 1
        ctypes.cast(out, ctypes.POINTER(ctypes.c_char_p))[0] = name
        return 0


@pytest.fixture
def driver(monkeypatch) -> Iterator[Driver]:
    fake = Driver()
    monkeypatch.setattr(cuda, "_libs", (fake, fake))
    monkeypatch.setattr(cuda, "_primary", 1)
    yield fake


def batch(lanes: int) -> cuda_batch.LanedBatch:
    host_in = np.zeros((4, 3, 8, 33, 1), np.float32)
    host_out = np.zeros((4, 2), np.float32)
    return cuda_batch.LanedBatch(host_in, host_out, 0x1000, 7, [11 + i for i in range(lanes)])


@pytest.mark.parametrize("lanes", [0, 2])
def test_a_batch_reports_the_first_failed_call_by_name(driver, lanes):
    b = batch(lanes)
    b.stage([np.zeros((3, 8, 33, 1), np.float32)] * 2)
    driver.fail = {"cuMemcpyHtoDAsync_v2": 1, "cuEventRecord": 2}
    bad = b.upload(list(range(lanes)) if lanes else [0])
    with pytest.raises(cuda.CudaError) as raised:
        b.finish(0x2000, list(range(lanes)) if lanes else [0], bad)
    # The upload failed first: its name, not CUDA_ERROR_NOT_INITIALIZED (1 | 2).
    assert "CUDA_ERROR_INVALID_VALUE (CUresult 1)" in str(raised.value)


def test_first_failure():
    assert cuda.first_failure(0, 0) == 0
    assert cuda.first_failure(0, 2, 1) == 2


def test_a_driver_that_does_not_initialise_is_named(driver, monkeypatch):
    monkeypatch.setattr(cuda, "_primary", None)
    driver.fail = {"cuInit": 100}
    with pytest.raises(BackendUnavailable, match=r"CUDA_ERROR_NO_DEVICE \(CUresult 100\)"):
        cuda.primary_context()


def test_memory_that_cannot_be_freed_is_named(driver):
    memory = cuda_batch.DriverMemory()
    memory.streams = [5]
    driver.fail = {"cuStreamDestroy_v2": 2}
    with pytest.raises(cuda.CudaError, match=r"CUDA_ERROR_OUT_OF_MEMORY \(CUresult 2\)"):
        memory.free()
