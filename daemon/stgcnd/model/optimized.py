"""The inference-optimized network: the same function as `stgcn.py`, fewer and cheaper steps.

Every BatchNorm folded, `A * importance` computed once, and the graph step one batched matrix
product with no permute copies; all exact up to float rounding. The rewrites are listed above
FusedBlock.
"""

from __future__ import annotations

from typing import Literal, TypeVar, cast

import torch
from torch import nn

from stgcnd.model.stgcn import STGCN, STGCNBlock, TwoStreamSTGCN, motion

Form = Literal["channels_last", "nchw"]
_M = TypeVar("_M", bound=nn.Module)


def _layer(layers: nn.Sequential | nn.ModuleList, i: int, kind: type[_M]) -> _M:
    """Layer `i` of a container of the original network, which must be a `kind`."""
    layer = layers[i]
    if not isinstance(layer, kind):
        raise TypeError(f"cannot optimize: layer {i} is a {type(layer).__name__}, "
                        f"not a {kind.__name__}")
    return layer


def _bn_affine(bn: nn.BatchNorm1d | nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    assert bn.running_mean is not None and bn.running_var is not None  # eval-mode statistics
    scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return scale, bn.bias - bn.running_mean * scale


def _fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    scale, shift = _bn_affine(bn)
    # cast: torch types _ConvNd's sizes for any N; a Conv2d's are pairs.
    fused = nn.Conv2d(conv.in_channels, conv.out_channels,
                      cast("tuple[int, int]", conv.kernel_size),
                      cast("tuple[int, int]", conv.stride),
                      cast("str | tuple[int, int]", conv.padding), bias=True)
    fused.weight.copy_(conv.weight * scale[:, None, None, None])
    bias = conv.bias if conv.bias is not None else torch.zeros_like(scale)
    assert fused.bias is not None  # bias=True
    fused.bias.copy_(bias * scale + shift)
    return fused


# Rewrites, all exact up to float rounding:
# - every BatchNorm is folded: tcn BNs and residual BNs into their convolutions; the BN after the
#   graph step into the graph convolution's weights, with the convolution's bias carried through
#   the graph step into a per-(channel, joint) bias B[c, w] = sum_k b[k, c] * colsum(A_k)[w];
# - `A * importance` is computed once;
# - the graph step is one batched matrix product. In `channels_last` form the features live as
#   (N*M, T, V, C) in memory, the conv's output channels are ordered (k, c), so (V, K) is one
#   contiguous axis of length V*K and out[t] = A2 @ x[t] with A2[w, v*K + k] = A[k, v, w]:
#   no permute copies anywhere. The `nchw` form (for ONNX export) uses batched MatMuls over the
#   partitions and a sum, also without transposes;
# - the data BN is a precomputed per-(channel, joint) scale and shift; the 1x1 classifier is a
#   linear layer.
class FusedBlock(nn.Module):
    a2: torch.Tensor    # buffers (channels_last form: a2; nchw: a)
    a: torch.Tensor
    bias: torch.Tensor

    def __init__(self, block: STGCNBlock, a: torch.Tensor, form: Form) -> None:
        super().__init__()
        self.form = form
        k, v, w = a.shape
        conv = block.gcn.conv
        c_out = conv.out_channels // k
        scale, shift = _bn_affine(_layer(block.tcn, 0, nn.BatchNorm2d))
        self.partitions, self.c_out = k, c_out
        # Graph conv with the post-graph BN scale folded in; its bias moves past the graph step.
        self.gcn = nn.Conv2d(conv.in_channels, conv.out_channels, 1, bias=False)
        self.gcn.weight.copy_(conv.weight * scale.repeat(k)[:, None, None, None])
        assert conv.bias is not None  # the original's graph conv has a bias
        b = conv.bias.view(k, c_out)                                   # [k, c]
        colsum = a.sum(dim=1)                                          # [k, w]
        bias_cw = scale[:, None] * torch.einsum("kc,kw->cw", b, colsum) + shift[:, None]
        if form == "channels_last":
            self.register_buffer("a2", a.permute(2, 1, 0).reshape(w, v * k).contiguous())
            self.register_buffer("bias", bias_cw.t().contiguous())      # [w, c]
        else:
            self.register_buffer("a", a.contiguous())
            self.register_buffer("bias", bias_cw[:, None, :].contiguous())  # [c, 1, w]
        self.tcn = _fold_conv_bn(_layer(block.tcn, 2, nn.Conv2d),
                                 _layer(block.tcn, 3, nn.BatchNorm2d))
        self.mode = "none" if not block.has_residual else (
            "identity" if block.residual is None else "conv")
        self.residual = (_fold_conv_bn(_layer(block.residual, 0, nn.Conv2d),
                                       _layer(block.residual, 1, nn.BatchNorm2d))
                         if self.mode == "conv" and block.residual is not None else None)

    def graph_step(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gcn(x)
        nm, _, t, v = x.shape
        if self.form == "channels_last":
            # (NM, KC, T, V) stored as (NM, T, V, K*C): a free view as (NM, T, V*K, C).
            y = torch.matmul(self.a2, x.permute(0, 2, 3, 1).reshape(nm, t, v * self.partitions,
                                                                     self.c_out))
            y = torch.relu(y + self.bias)                               # (NM, T, W, C)
            return y.permute(0, 3, 1, 2)                                # channels_last again
        y = torch.matmul(x.view(nm, self.partitions, self.c_out * t, v), self.a).sum(dim=1)
        return torch.relu(y.view(nm, self.c_out, t, v) + self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tcn(self.graph_step(x))
        if self.mode == "identity":
            y = y + x
        elif self.residual is not None:  # mode "conv"
            y = y + self.residual(x)
        return torch.relu(y)


class FusedStream(nn.Module):
    in_scale: torch.Tensor  # buffers
    in_shift: torch.Tensor

    def __init__(self, stream: STGCN, form: Form) -> None:
        super().__init__()
        self.form = form
        v = stream.A.shape[1]
        c = stream.data_bn.num_features // v
        scale, shift = _bn_affine(stream.data_bn)
        # data_bn channel index is v*C + c; store as (C, 1, V, 1) to broadcast on (N,C,T,V,M).
        self.register_buffer("in_scale", scale.view(v, c).t().reshape(c, 1, v, 1).contiguous())
        self.register_buffer("in_shift", shift.view(v, c).t().reshape(c, 1, v, 1).contiguous())
        blocks = []
        for i in range(len(stream.st_gcn_networks)):
            a = stream.A if stream.edge_importance is None else stream.A * stream.edge_importance[i]
            blocks.append(FusedBlock(_layer(stream.st_gcn_networks, i, STGCNBlock), a, form))
        self.blocks = nn.ModuleList(blocks)
        fcn = stream.fcn
        self.fc = nn.Linear(fcn.in_channels, fcn.out_channels)
        self.fc.weight.copy_(fcn.weight.flatten(1))
        assert fcn.bias is not None  # the original's classifier has a bias
        self.fc.bias.copy_(fcn.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, t, v, m = x.shape
        x = x * self.in_scale + self.in_shift
        x = x.permute(0, 4, 1, 2, 3).reshape(n * m, c, t, v)
        if self.form == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        for block in self.blocks:
            x = block(x)
        x = x.mean(dim=(2, 3)).view(n, m, -1).mean(dim=1)
        return self.fc(x)


class FusedTwoStream(nn.Module):
    def __init__(self, model: TwoStreamSTGCN, form: Form) -> None:
        super().__init__()
        self.motion_formula = model.motion_formula
        self.origin = FusedStream(model.origin_stream, form)
        self.motion = FusedStream(model.motion_stream, form)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.origin(x) + self.motion(motion(x, self.motion_formula))


@torch.no_grad()
def optimize(module: nn.Module, form: Form = "channels_last") -> nn.Module:
    """The fused equivalent of an eval-mode STGCN or TwoStreamSTGCN (new module, CPU, eval)."""
    if isinstance(module, TwoStreamSTGCN):
        fused: nn.Module = FusedTwoStream(module, form)
    elif isinstance(module, STGCN):
        fused = FusedStream(module, form)
    else:
        raise TypeError(f"cannot optimize {type(module).__name__}")
    return fused.eval()


def optimize_for_export(model) -> nn.Module:  # model: LoadedModel
    """The fused network in the transpose-free NCHW form, for ONNX export."""
    return optimize(model.module, "nchw")
