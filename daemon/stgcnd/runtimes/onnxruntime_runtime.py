"""ONNX Runtime: the store's optimized ONNX model (fp32) or its Q/DQ INT8 model.

One InferenceSession per runtime, shared by its runners (`run` is thread-safe, the weights are
loaded once). ONNX Runtime computes on the calling thread, so each runner computes on its
worker thread (base.HostRunner in an InWorker).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.export import INPUT_NAME, OUTPUT_NAME
from stgcnd.log import get_logger
from stgcnd.runtimes import import_onnxruntime
from stgcnd.runtimes.base import HostRunner, Runner, Runtime, RuntimeInfo

log = get_logger(__name__)


def providers(device: str) -> list[str | tuple[str, dict[str, int]]]:
    """The execution providers for `device`: the CPU's, or CUDA's (on its device index) with
    the CPU's for the operators CUDA lacks."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if not device.startswith("cuda"):
        raise UserError(f"unknown device {device!r}; use cpu or cuda")
    if "CUDAExecutionProvider" not in import_onnxruntime().get_available_providers():
        raise BackendUnavailable("onnxruntime has no CUDA execution provider here; pip "
                                 "install onnxruntime-gpu (instead of onnxruntime), or use "
                                 "device cpu")
    index = int(device.split(":")[1]) if ":" in device else 0
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]


def provider_names(device: str) -> list[str]:
    return [p if isinstance(p, str) else p[0] for p in providers(device)]


def ort_session(source: Path | bytes, device: str = "cpu", threads: int = 0,
                optimized_to: Path | None = None) -> Any:
    """The one way stgcnd opens an ONNX Runtime session (serving, building, validating,
    calibrating): the providers for `device`, `threads` intra-op threads and one inter-op
    (sequential: a runner's worker thread is the parallelism), errors-only logging.
    `optimized_to`: extended graph optimizations applied, and the optimized model saved there
    (the builder's fp32 artefact, so that no start optimizes again)."""
    ort = import_onnxruntime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    if optimized_to is not None:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        opts.optimized_model_filepath = str(optimized_to)
    return ort.InferenceSession(str(source) if isinstance(source, Path) else source, opts,
                                providers=providers(device))


class OnnxRuntimeRuntime(Runtime):
    def __init__(self, model_path: Path, input_shape: tuple[int, ...], num_class: int,
                 max_batch: int = 1, precision: str = "fp32", threads: int = 0,
                 device: str = "cpu") -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise UserError(f"ONNX model {self.model_path} not found; rebuild it with "
                            "`stgcnd build --backend onnxruntime`")
        self.session = ort_session(self.model_path, device, threads)
        # The graph's own class count (its output's last dimension), not the manifest's.
        last = self.session.get_outputs()[0].shape[-1]
        self.classes = last if isinstance(last, int) and last > 0 else None
        self.info = RuntimeInfo(
            name="onnxruntime", precision=precision, device=device,
            input_shape=tuple(input_shape), num_class=int(num_class), max_batch=int(max_batch),
            artifact=str(self.model_path),
            details={"onnxruntime": import_onnxruntime().__version__, "threads": threads,
                     "providers": provider_names(device)})
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
