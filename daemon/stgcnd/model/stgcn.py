"""Two-stream ST-GCN, written to compute exactly what the original st-gcn code computes.

Module and parameter names match the original (`net/st_gcn.py`, `net/st_gcn_twostream.py`),
so its checkpoints load strictly; the names and shapes are listed above TwoStreamSTGCN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from stgcnd.model.architecture import TEMPORAL_KERNEL, WIDTHS, block_channels
from stgcnd.model.spec import MOTION_FORMULAS

MotionFormula = Literal["first-difference", "second-difference"]
GraphOp = Literal["einsum", "matmul"]



def motion(x: torch.Tensor, formula: MotionFormula = "first-difference") -> torch.Tensor:
    """The motion stream's input from a window x of shape (N, C, T, V, M).

    first-difference:  m[t] = x[t] - x[t-1], m[0] = 0
    second-difference: m[t] = x[t] - x[t+1]/2 - x[t-1]/2 for 0 < t < T-1, zero at both ends
                       (the original st-gcn two-stream model)
    Built from slices and a concatenation of zeros made with `new_zeros`, so it exports to ONNX
    on any device (the original used CUDA-only tensors here).
    """
    zero = x.new_zeros(x.shape[0], x.shape[1], 1, x.shape[3], x.shape[4])
    if formula == "first-difference":
        return torch.cat((zero, x[:, :, 1:] - x[:, :, :-1]), dim=2)
    if formula == "second-difference":
        inner = x[:, :, 1:-1] - 0.5 * x[:, :, 2:] - 0.5 * x[:, :, :-2]
        return torch.cat((zero, inner, zero), dim=2)
    raise ValueError(f"unknown motion formula {formula!r}; use one of {', '.join(MOTION_FORMULAS)}")


class GraphConv(nn.Module):
    """The spatial step: a 1x1 conv to K partitions, then aggregation over neighbours by A."""

    def __init__(self, in_channels: int, out_channels: int, partitions: int,
                 graph_op: GraphOp = "einsum") -> None:
        super().__init__()
        self.partitions = partitions
        self.graph_op = graph_op
        self.conv = nn.Conv2d(in_channels, out_channels * partitions, kernel_size=1)

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        n, kc, t, v = x.shape
        k = self.partitions
        if self.graph_op == "einsum":
            x = x.view(n, k, kc // k, t, v)
            return torch.einsum("nkctv,kvw->nctw", x, a).contiguous()
        # The same contraction as batched MatMuls plus a sum over partitions: no transposes,
        # which ONNX Runtime and TensorRT run as plain GEMMs.
        x = x.view(n, k, (kc // k) * t, v)
        return torch.matmul(x, a).sum(dim=1).view(n, kc // k, t, v)


class STGCNBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, partitions: int, stride: int,
                 residual: bool, graph_op: GraphOp = "einsum") -> None:
        super().__init__()
        pad = (TEMPORAL_KERNEL - 1) // 2
        self.gcn = GraphConv(in_channels, out_channels, partitions, graph_op)
        self.tcn = nn.Sequential(
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
            nn.Conv2d(out_channels, out_channels, (TEMPORAL_KERNEL, 1), (stride, 1), (pad, 0)),
            nn.BatchNorm2d(out_channels),
        )
        self.has_residual = residual
        self.residual: nn.Sequential | None = None
        if residual and (in_channels != out_channels or stride != 1):
            self.residual = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=(stride, 1)),
                nn.BatchNorm2d(out_channels),
            )
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        if not self.has_residual:
            res: torch.Tensor | float = 0.0
        elif self.residual is None:
            res = x
        else:
            res = self.residual(x)
        return self.relu(self.tcn(self.gcn(x, a)) + res)


class STGCN(nn.Module):
    """One stream: data BN, 10 ST-GCN blocks, global pooling, 1x1 classifier."""

    A: torch.Tensor  # a buffer (K, V, V), saved in the checkpoint

    def __init__(self, a: torch.Tensor, num_class: int, in_channels: int = 3,
                 edge_importance: bool = True, graph_op: GraphOp = "einsum",
                 widths: Sequence[int] = WIDTHS) -> None:
        super().__init__()
        if a.dim() != 3 or a.shape[1] != a.shape[2]:
            raise ValueError(f"A must have shape (K, V, V), got {tuple(a.shape)}")
        partitions, num_node = int(a.shape[0]), int(a.shape[1])
        self.register_buffer("A", a.detach().clone().float())
        self.data_bn = nn.BatchNorm1d(in_channels * num_node)
        self.st_gcn_networks = nn.ModuleList(
            STGCNBlock(cin, cout, partitions, stride, kind != "none", graph_op)
            for cin, cout, stride, kind in block_channels(in_channels, widths)
        )
        self.edge_importance: nn.ParameterList | None = None
        if edge_importance:
            self.edge_importance = nn.ParameterList(
                nn.Parameter(torch.ones_like(self.A)) for _ in self.st_gcn_networks
            )
        self.fcn = nn.Conv2d(widths[-1], num_class, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, t, v, m = x.shape
        # data_bn normalises each (joint, channel) pair, shared by all persons: (N*M, V*C, T).
        x = x.permute(0, 4, 3, 1, 2).reshape(n * m, v * c, t)
        x = self.data_bn(x)
        x = x.view(n, m, v, c, t).permute(0, 1, 3, 4, 2).reshape(n * m, c, t, v)
        for i, block in enumerate(self.st_gcn_networks):
            a = self.A if self.edge_importance is None else self.A * self.edge_importance[i]
            x = block(x, a)
        # Global average pooling as a mean: exports as ReduceMean, no computed pooling kernel.
        x = x.mean(dim=(2, 3))
        x = x.view(n, m, -1).mean(dim=1)
        return self.fcn(x[:, :, None, None]).flatten(1)


# Module and parameter names match the original (`net/st_gcn.py`, `net/st_gcn_twostream.py`) so
# its checkpoints load strictly:
#
#     origin_stream.A                          (K, V, V) graph, a buffer saved in the checkpoint
#     origin_stream.data_bn.*                  BatchNorm1d(C*V), channel index v*C + c
#     origin_stream.st_gcn_networks.{0..9}.gcn.conv.*          1x1 conv to K*C_out channels
#     origin_stream.st_gcn_networks.{i}.tcn.{0,2,3}.*          BN, ReLU, (9x1) conv, BN
#     origin_stream.st_gcn_networks.{4,7}.residual.{0,1}.*     1x1 strided conv + BN
#     origin_stream.edge_importance.{0..9}     (K, V, V) learned edge weights
#     origin_stream.fcn.*                      Conv2d(256, num_class, 1)
#     motion_stream.*                          the same for the motion input
#
# Shapes: input (N, C=3, T, V, M) -> logits (N, num_class). Persons are folded into the batch,
# pooled by a mean over (T, V), then averaged over the M person slots (empty slots included, as
# in the original) before the classifier. Dropout is an identity at inference and omitted.
class TwoStreamSTGCN(nn.Module):
    """Sum of the logits of an appearance stream and a motion stream."""

    def __init__(self, a: torch.Tensor, num_class: int, in_channels: int = 3,
                 edge_importance: bool = True, motion_formula: MotionFormula = "first-difference",
                 graph_op: GraphOp = "einsum", widths: Sequence[int] = WIDTHS) -> None:
        super().__init__()
        if motion_formula not in MOTION_FORMULAS:
            raise ValueError(f"unknown motion formula {motion_formula!r}")
        self.motion_formula = motion_formula
        self.origin_stream = STGCN(a, num_class, in_channels, edge_importance, graph_op, widths)
        self.motion_stream = STGCN(a, num_class, in_channels, edge_importance, graph_op, widths)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.origin_stream(x) + self.motion_stream(motion(x, self.motion_formula))
