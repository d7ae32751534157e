"""ONNX Runtime: the store's optimized ONNX model (fp32) or its Q/DQ INT8 model.

One InferenceSession per runtime, shared by its runners (`run` is thread-safe, the weights are
loaded once). ONNX Runtime computes on the calling thread, so each runner computes on its
worker thread (base.HostRunner in an InWorker).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.log import get_logger
from stgcnd.runtimes import import_onnxruntime
from stgcnd.runtimes.base import HostRunner, Runner, Runtime, RuntimeInfo

log = get_logger(__name__)

INPUT_NAME = "input"
OUTPUT_NAME = "output"


class OnnxRuntimeRuntime(Runtime):
    def __init__(self, model_path: Path, input_shape: tuple[int, ...], num_class: int,
                 max_batch: int = 1, precision: str = "fp32", threads: int = 0,
                 device: str = "cpu") -> None:
        ort = import_onnxruntime()
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise UserError(f"ONNX model {self.model_path} not found; rebuild it with "
                            "`stgcnd build --backend onnxruntime`")
        if device == "cpu":
            providers: list[object] = ["CPUExecutionProvider"]
        elif device.startswith("cuda"):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendUnavailable("onnxruntime has no CUDA execution provider here; "
                                         "pip install onnxruntime-gpu (instead of onnxruntime)")
            index = int(device.split(":")[1]) if ":" in device else 0
            providers = [("CUDAExecutionProvider", {"device_id": index}),
                         "CPUExecutionProvider"]
        else:
            raise UserError(f"unknown device {device!r}; use cpu or cuda")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(self.model_path), opts, providers=providers)
        self.info = RuntimeInfo(
            name="onnxruntime", precision=precision, device=device,
            input_shape=tuple(input_shape), num_class=int(num_class), max_batch=int(max_batch),
            artifact=str(self.model_path),
            details={"onnxruntime": ort.__version__, "threads": threads,
                     "providers": [p if isinstance(p, str) else p[0]  # type: ignore[index]
                                   for p in providers]})
        log.info("backend_loaded", backend="onnxruntime", precision=precision, device=device,
                 threads=threads, path=str(self.model_path))

    def _open_runner(self, buckets: Sequence[int], lanes: int) -> Runner:
        return HostRunner(self.info, self._compute, buckets, lanes)

    def _compute(self, batch: np.ndarray) -> tuple[np.ndarray, float]:
        t0 = time.perf_counter()
        out = self.session.run([OUTPUT_NAME], {INPUT_NAME: batch})[0]
        return np.asarray(out, dtype=np.float32), (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        self.session = None
