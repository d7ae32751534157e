"""Explicit INT8: a Q/DQ ONNX model by static quantization with ONNX Runtime.

QuantizeLinear/DequantizeLinear pairs carry the INT8 scales inside the graph. TensorRT >= 8.6
builds such a graph as INT8 (explicit quantization; on 11.x the only INT8 path), and ONNX
Runtime runs it on the CPU, so its accuracy can be measured anywhere. Scales are symmetric
(zero point 0) because TensorRT supports only those; weights are per output channel.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.errors import BackendUnavailable
from stgcnd.log import get_logger

log = get_logger(__name__)

# The convolutions carry nearly all the compute. The graph step's MatMul with the adjacency A
# stays float: A is a batched (K, V, W) constant whose per-channel scales ONNX Runtime's
# QLinearMatMul cannot run, and it is cheap next to the 9x1 temporal convolutions. Element-wise
# ops stay float too, as TensorRT fuses them into the neighbouring INT8 kernels anyway.
QUANTIZED_OPS = ("Conv", "Gemm")


def _reader_class() -> type:
    from onnxruntime.quantization import CalibrationDataReader

    class WindowReader(CalibrationDataReader):
        """Feeds calibration windows to ONNX Runtime's calibrator, `batch` at a time."""

        def __init__(self, windows: np.ndarray, input_name: str, batch: int) -> None:
            self.windows, self.input_name, self.batch = windows, input_name, batch
            self.pos = 0

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self.pos >= len(self.windows):
                return None
            chunk = self.windows[self.pos:self.pos + self.batch]
            self.pos += self.batch
            return {self.input_name: np.ascontiguousarray(chunk, dtype=np.float32)}

        def rewind(self) -> None:
            self.pos = 0

    return WindowReader


def quantize_qdq(onnx_path: Path, output: Path, windows: np.ndarray, dynamic_batch: bool,
                 input_name: str = "input", method: str = "minmax") -> dict[str, Any]:
    """Write a Q/DQ INT8 copy of `onnx_path` to `output` (written in place: use a temp path)."""
    try:
        from onnxruntime.quantization import (
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )
    except ImportError:
        raise BackendUnavailable(
            "INT8 Q/DQ models are made with onnxruntime.quantization; install it with "
            "pip install 'stgcnd[onnxruntime]'") from None
    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    reader = _reader_class()(windows, input_name, 16 if dynamic_batch else 1)
    t0 = time.perf_counter()
    # onnxruntime.quantization logs advice through the root logger at WARNING on every call
    # (pre-processing hints that do not apply to this graph); keep it out of stgcnd's log.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        quantize_static(
            str(onnx_path), str(output), reader,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTIZED_OPS),
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=methods[method],
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
    finally:
        logging.disable(previous)
    info = {"format": "qdq", "method": method, "per_channel": True, "symmetric": True,
            "ops": list(QUANTIZED_OPS), "calibration_windows": len(windows),
            "seconds": round(time.perf_counter() - t0, 3)}
    log.info("onnx_quantized", output=str(output), **info)
    return info

