"""ONNX Runtime backend: the store's optimized ONNX model (fp32) or its Q/DQ INT8 model.

On the CPU all sessions share one `InferenceSession` (its `run` is thread-safe and the weights
are loaded once); each stgcnd session owns its output buffers. With the CUDA execution provider
(onnxruntime-gpu) each stgcnd session gets its own InferenceSession, hence its own CUDA stream.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.backends.base import Backend, BackendInfo, Session
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.log import get_logger
from stgcnd.runtimes import import_onnxruntime

log = get_logger(__name__)

INPUT_NAME = "input"
OUTPUT_NAME = "output"


class OnnxRuntimeBackend(Backend):
    def __init__(self, model_path: Path, input_shape: tuple[int, ...], num_class: int,
                 max_batch: int = 1, precision: str = "fp32", threads: int = 0,
                 device: str = "cpu") -> None:
        ort = import_onnxruntime()
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise UserError(f"ONNX model {self.model_path} not found; rebuild it with "
                            "`stgcnd build --backend onnxruntime`")
        if device == "cpu":
            self.providers: list[Any] = ["CPUExecutionProvider"]
        elif device.startswith("cuda"):
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise BackendUnavailable("onnxruntime has no CUDA execution provider here; "
                                         "pip install onnxruntime-gpu (instead of onnxruntime)")
            index = int(device.split(":")[1]) if ":" in device else 0
            self.providers = [("CUDAExecutionProvider", {"device_id": index}),
                              "CPUExecutionProvider"]
        else:
            raise UserError(f"unknown device {device!r}; use cpu or cuda")
        self.threads = threads
        self.device = device
        self._shared = self._make_session() if device == "cpu" else None
        self.info = BackendInfo(
            name="onnxruntime", precision=precision, device=device,
            input_shape=tuple(input_shape), num_class=int(num_class), max_batch=int(max_batch),
            artifact=str(self.model_path),
            details={"onnxruntime": ort.__version__, "threads": threads,
                     "providers": [p if isinstance(p, str) else p[0] for p in self.providers]})
        log.info("backend_loaded", backend="onnxruntime", precision=precision, device=device,
                 threads=threads, path=str(self.model_path))

    @classmethod
    def from_artifact(cls, artifact: Any, threads: int = 0, device: str = "cpu"
                      ) -> OnnxRuntimeBackend:
        m = artifact.manifest
        path = artifact.path if artifact.path is not None else artifact.onnx_path
        return cls(Path(path), tuple(m["input_shape"]), int(m["num_class"]),
                   int(m.get("max_batch", 1)), artifact.precision, threads, device)

    def _make_session(self) -> Any:
        ort = import_onnxruntime()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.log_severity_level = 3
        return ort.InferenceSession(str(self.model_path), opts, providers=self.providers)

    def open_session(self) -> Session:
        return _OrtSession(self)

    def close(self) -> None:
        self._shared = None


class _OrtSession(Session):
    backend: OnnxRuntimeBackend

    def __init__(self, backend: OnnxRuntimeBackend) -> None:
        super().__init__(backend)
        self.sess: Any = backend._shared or backend._make_session()
        self._own = backend._shared is None

    def _infer(self, batch: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        x = batch.astype(np.float32, copy=False)
        out = self.sess.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
        ms = (time.perf_counter() - t0) * 1e3
        self.last_timings = {"compute_ms": ms, "total_ms": ms}
        return np.asarray(out, dtype=np.float32)

    def _release(self) -> None:
        self.sess = None
