"""The demo model's ONNX graph, built from its numpy weights with the onnx package (no torch).

The same function and interface as stgcnd.export.onnx_export (input `input` (N, 3, T, V, M),
output `output` logits, opset 17), so the store, ONNX Runtime and TensorRT treat it like any
export.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stgcnd.export import INPUT_NAME, OPSET, OUTPUT_NAME
from stgcnd.model.architecture import TEMPORAL_KERNEL
from stgcnd.model.folded import FoldedBlock, FoldedStream

IR_VERSION = 8          # what opset 17 needs; accepted by every ONNX Runtime and TensorRT 8.6+
VARIANT = "numpy-demo"


# Per stream: data BN as Mul/Add; persons folded into the batch (Transpose, Reshape); per block a
# 1x1 Conv, the graph step as MatMul with A over the partitions plus ReduceSum, bias, Relu, the
# (9x1) temporal Conv, the residual (none, identity or a 1x1 Conv), Add, Relu; then ReduceMean
# over (T, V) and over persons, and a Gemm classifier. Two streams add their logits; the motion
# stream's input is a difference over time (Slice, Sub, Pad).
class _Graph:
    """Accumulates nodes and initializers with unique names."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, hint: str, value: np.ndarray, dtype: Any = np.float32) -> str:
        from onnx import numpy_helper

        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype=dtype), name))
        return name

    def ints(self, hint: str, values: list[int]) -> str:
        return self.const(hint, np.array(values, dtype=np.int64), np.int64)

    def op(self, op_type: str, inputs: list[str], hint: str | None = None,
           output: str | None = None, **attrs: Any) -> str:
        from onnx import helper

        out = output or self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(op_type),
                                           **attrs))
        return out


def _block(g: _Graph, h: str, blk: FoldedBlock, t: int, v: int, prefix: str) -> tuple[str, int]:
    k, c = blk.partitions, blk.channels
    y = g.op("Conv", [h, g.const(f"{prefix}gcn_w", blk.gcn_weight[:, :, None, None])],
             kernel_shape=[1, 1])
    y = g.op("Reshape", [y, g.ints("shape", [-1, k, c * t, v])])
    y = g.op("MatMul", [y, g.const(f"{prefix}A", blk.adjacency)])
    y = g.op("ReduceSum", [y, g.ints("axes", [1])], keepdims=0)
    y = g.op("Reshape", [y, g.ints("shape", [-1, c, t, v])])
    y = g.op("Relu", [g.op("Add", [y, g.const(f"{prefix}gcn_b", blk.bias)])])
    pad = (TEMPORAL_KERNEL - 1) // 2
    y = g.op("Conv", [y, g.const(f"{prefix}tcn_w", blk.tcn_weight),
                      g.const(f"{prefix}tcn_b", blk.tcn_bias)],
             kernel_shape=[TEMPORAL_KERNEL, 1], pads=[pad, 0, pad, 0], strides=[blk.stride, 1])
    if blk.residual == "identity":
        y = g.op("Add", [y, h])
    elif blk.residual == "conv":
        assert blk.res_weight is not None and blk.res_bias is not None
        r = g.op("Conv", [h, g.const(f"{prefix}res_w", blk.res_weight),
                          g.const(f"{prefix}res_b", blk.res_bias)],
                 kernel_shape=[1, 1], strides=[blk.stride, 1])
        y = g.op("Add", [y, r])
    t_out = (t + 2 * pad - TEMPORAL_KERNEL) // blk.stride + 1
    return g.op("Relu", [y]), t_out


def _stream(g: _Graph, x: str, stream: FoldedStream, shape: tuple[int, int, int, int],
            prefix: str, output: str | None = None) -> str:
    c, t, v, m = shape
    h = g.op("Mul", [x, g.const(f"{prefix}in_scale", stream.in_scale)])
    h = g.op("Add", [h, g.const(f"{prefix}in_shift", stream.in_shift)])
    h = g.op("Transpose", [h], perm=[0, 4, 1, 2, 3])            # (N, M, C, T, V)
    h = g.op("Reshape", [h, g.ints("shape", [-1, c, t, v])])    # (N*M, C, T, V)
    for i, blk in enumerate(stream.blocks):
        h, t = _block(g, h, blk, t, v, f"{prefix}b{i}_")
    h = g.op("ReduceMean", [h], axes=[2, 3], keepdims=0)        # (N*M, 256)
    h = g.op("Reshape", [h, g.ints("shape", [-1, m, stream.fc_weight.shape[1]])])
    h = g.op("ReduceMean", [h], axes=[1], keepdims=0)           # (N, 256)
    return g.op("Gemm", [h, g.const(f"{prefix}fc_w", stream.fc_weight),
                         g.const(f"{prefix}fc_b", stream.fc_bias)], transB=1, output=output)


def _slice_t(g: _Graph, x: str, start: int, end: int) -> str:
    return g.op("Slice", [x, g.ints("starts", [start]), g.ints("ends", [end]),
                          g.ints("axes", [2])])


def _motion(g: _Graph, x: str, t: int, formula: str) -> str:
    """The motion stream's input; zero where the difference is undefined (as stgcn.motion)."""
    if formula == "first-difference":
        d = g.op("Sub", [_slice_t(g, x, 1, t), _slice_t(g, x, 0, t - 1)])
        pads = [0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    elif formula == "second-difference":
        half = g.const("half", np.array(0.5))
        d = g.op("Sub", [_slice_t(g, x, 1, t - 1), g.op("Mul", [_slice_t(g, x, 2, t), half])])
        d = g.op("Sub", [d, g.op("Mul", [_slice_t(g, x, 0, t - 2), half])])
        pads = [0, 0, 1, 0, 0, 0, 0, 1, 0, 0]
    else:
        raise ValueError(f"unknown motion formula {formula!r}")
    return g.op("Pad", [d, g.ints("pads", pads)], mode="constant")


def build_onnx(streams: tuple[FoldedStream, ...], input_shape: tuple[int, int, int, int],
               motion_formula: str = "first-difference", dynamic_batch: bool = False,
               opset: int = OPSET) -> bytes:
    """Serialised ONNX for folded streams (one, or origin + motion) and one window shape."""
    from onnx import TensorProto, helper

    g = _Graph()
    num_class = int(streams[0].fc_weight.shape[0])
    batch: Any = "batch" if dynamic_batch else 1
    if len(streams) == 1:
        _stream(g, INPUT_NAME, streams[0], input_shape, "s_", output=OUTPUT_NAME)
    else:
        origin = _stream(g, INPUT_NAME, streams[0], input_shape, "origin_")
        mot = _motion(g, INPUT_NAME, input_shape[1], motion_formula)
        moved = _stream(g, mot, streams[1], input_shape, "motion_")
        g.op("Add", [origin, moved], output=OUTPUT_NAME)
    graph = helper.make_graph(
        g.nodes, "stgcnd_demo",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [batch, *input_shape])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [batch, num_class])],
        initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="stgcnd.export.demo_onnx", ir_version=IR_VERSION)
    return model.SerializeToString()


def demo_onnx_bytes(spec: Any, dynamic_batch: bool = False) -> bytes:
    """The ONNX graph of the demo model `spec` (no checkpoint) stands for."""
    from stgcnd.model.demo import spec_arrays
    from stgcnd.model.folded import fold_state

    if not spec.is_demo:
        raise ValueError("demo_onnx_bytes builds the demo model only; export a checkpoint with "
                         "stgcnd export")
    return build_onnx(fold_state(spec_arrays(spec)), spec.input_shape, spec.motion,
                      dynamic_batch)
