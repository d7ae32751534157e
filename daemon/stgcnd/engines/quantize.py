"""Explicit INT8: Q/DQ ONNX models by static quantization with ONNX Runtime, two recipes
(docs/engines.md, "INT8 that users can trust"): the TensorRT recipe (`quantize_qdq`: symmetric
scales, float bias, Conv/Gemm: what TensorRT's parser builds as INT8) and the CPU recipe
(`quantize_for_cpu`: u8 asymmetric activations, int32 bias, Conv/MatMul/Gemm: what ONNX
Runtime's CPU kernels run as integer kernels).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.errors import BackendUnavailable
from stgcnd.log import get_logger
from stgcnd.runtimes.onnxruntime_runtime import ort_session

log = get_logger(__name__)

# The convolutions carry nearly all the compute. The graph step's MatMul with the adjacency A
# stays float: A is a batched (K, V, W) constant whose per-channel scales ONNX Runtime's
# QLinearMatMul cannot run, and it is cheap next to the 9x1 temporal convolutions. Element-wise
# ops stay float too, as TensorRT fuses them into the neighbouring INT8 kernels anyway.
QUANTIZED_OPS = ("Conv", "Gemm")

# The Q/DQ layout TensorRT's ONNX parser accepts (onnx/onnx-tensorrt#850,
# microsoft/onnxruntime#14229): DequantizeLinear may only read INT8 (FP8/INT4 on newer
# releases) tensors, so biases stay float (TensorRT fuses them into the INT8 kernel itself)
# instead of ONNX Runtime's default INT32 bias DequantizeLinear; weights keep a real
# QuantizeLinear -> DequantizeLinear pair on their float initializer (TensorRT folds it into
# an INT8 weight; a bare DequantizeLinear of an INT8 initializer is what older parsers reject),
# and every consumer gets its own pair so that TensorRT can fuse each one into its layer.
# Symmetric scales (zero point 0) are the only ones TensorRT supports.
TENSORRT_QDQ_OPTIONS = {
    "ActivationSymmetric": True,
    "WeightSymmetric": True,
    "QuantizeBias": False,
    "AddQDQPairToWeight": True,
    "DedicatedQDQPair": True,
}


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


# The CPU recipe's options (ONNX Runtime's defaults otherwise: int32 bias, shared Q/DQ).
CPU_QDQ_OPTIONS = {"ActivationSymmetric": False, "WeightSymmetric": True}
CPU_QUANTIZED_OPS = ("Conv", "MatMul", "Gemm")


def quantize_qdq(onnx_path: Path, output: Path, windows: np.ndarray, dynamic_batch: bool,
                 input_name: str = "input", method: str = "minmax") -> dict[str, Any]:
    """Write the TensorRT recipe's Q/DQ INT8 copy of `onnx_path` to `output` (written in
    place: use a temp path)."""
    info = _quantize(onnx_path, output, windows, dynamic_batch, input_name, method,
                     QUANTIZED_OPS, unsigned=False, options=TENSORRT_QDQ_OPTIONS)
    problems = tensorrt_qdq_problems(output)
    if problems:  # would only fail later, inside TensorRT's parser on the device
        raise RuntimeError(f"the Q/DQ model {output} is not parseable by TensorRT: "
                           f"{'; '.join(problems[:3])}; report this with your onnxruntime "
                           "version (pip show onnxruntime)")
    info.update(recipe="tensorrt", symmetric=True)
    log.info("onnx_quantized", output=str(output), **info)
    return info


def quantize_for_cpu(onnx_path: Path, output: Path, windows: np.ndarray, dynamic_batch: bool,
                     input_name: str = "input", method: str = "minmax") -> dict[str, Any]:
    """Write the CPU recipe's Q/DQ INT8 copy of `onnx_path` to `output` (a temp path)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = output.with_name(f"{output.stem}.prepared.onnx")
    try:
        quant_pre_process(str(onnx_path), str(prepared), skip_symbolic_shape=True)
        info = _quantize(prepared, output, windows, dynamic_batch, input_name, method,
                         CPU_QUANTIZED_OPS, unsigned=True, options=CPU_QDQ_OPTIONS)
        refused = _cpu_refuses(output, windows[:1], input_name)
        if refused:
            # Older ONNX Runtime (1.19, the last for Python 3.8) cannot run QLinearMatMul with
            # a per-channel constant B (the graph step's adjacency): leave the MatMul float.
            ops = tuple(op for op in CPU_QUANTIZED_OPS if op != "MatMul")
            info = _quantize(prepared, output, windows, dynamic_batch, input_name, method,
                             ops, unsigned=True, options=CPU_QDQ_OPTIONS)
            info["matmul_left_float"] = refused[:200]
    finally:
        prepared.unlink(missing_ok=True)
    info.update(recipe="cpu", symmetric=False)
    log.info("onnx_quantized", output=str(output), **info)
    return info


def _cpu_refuses(model: Path, window: np.ndarray, input_name: str) -> str:
    """Why ONNX Runtime's CPU provider cannot run `model` on one window ('' if it can)."""
    try:
        session = ort_session(model)
        session.run(None, {input_name: np.ascontiguousarray(window, dtype=np.float32)})
    except Exception as exc:  # onnxruntime raises its own exception types
        return str(exc)
    return ""


def _quantize(onnx_path: Path, output: Path, windows: np.ndarray, dynamic_batch: bool,
              input_name: str, method: str, ops: tuple[str, ...], unsigned: bool,
              options: dict[str, bool]) -> dict[str, Any]:
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
        quantize_static(str(onnx_path), str(output), reader, quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=list(ops), per_channel=True,
                        activation_type=QuantType.QUInt8 if unsigned else QuantType.QInt8,
                        weight_type=QuantType.QInt8, calibrate_method=methods[method],
                        extra_options=dict(options))
    finally:
        logging.disable(previous)
    return {"format": "qdq", "method": method, "per_channel": True, "ops": list(ops),
            "calibration_windows": len(windows),
            "seconds": round(time.perf_counter() - t0, 3)}



def tensorrt_qdq_problems(model: Any) -> list[str]:
    """Why TensorRT's ONNX parser would reject this Q/DQ model (empty: it would not).

    Checks the two layouts onnx-tensorrt refuses: a DequantizeLinear reading anything but an
    INT8 tensor (ONNX Runtime's default INT32 bias), and a quantized Conv/Gemm/MatMul whose
    weight initializer does not go through its own QuantizeLinear -> DequantizeLinear pair.
    `model` is a path or an onnx.ModelProto.
    """
    import onnx

    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    int8 = onnx.TensorProto.INT8
    problems = []
    for node in graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        src = node.input[0]
        if src in inits:
            elem = inits[src].data_type
        elif src in producer and producer[src].op_type == "QuantizeLinear":
            q = producer[src]
            zp = inits.get(q.input[2]) if len(q.input) > 2 else None
            elem = zp.data_type if zp is not None else onnx.TensorProto.UINT8
        else:
            elem = None  # a graph input or another op's output: not something we make
        if elem != int8:
            name = onnx.TensorProto.DataType.Name(elem) if elem is not None else "unknown"
            problems.append(f"DequantizeLinear {node.name or src} reads {name}, not INT8")
    for node in graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2:
            continue
        act = producer.get(node.input[0])
        if act is None or act.op_type != "DequantizeLinear":
            continue  # left in float on purpose (e.g. the graph step's MatMul)
        dq = producer.get(node.input[1])
        q = producer.get(dq.input[0]) if dq is not None else None
        if (dq is None or dq.op_type != "DequantizeLinear" or q is None
                or q.op_type != "QuantizeLinear" or q.input[0] not in inits):
            problems.append(f"{node.op_type} {node.name} has a quantized input but its weight "
                            f"{node.input[1]} has no QuantizeLinear -> DequantizeLinear pair")
    return problems
