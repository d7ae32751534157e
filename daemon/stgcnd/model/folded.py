"""Inference weights of an original-format state, in numpy: every BatchNorm folded away.

The same rewrites as optimized.py, without torch: the demo model's ONNX graph is built from
these, and `folded_logits` is the reference when torch is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stgcnd.model.architecture import BN_EPS, block_channels, state_widths


# Per block: y = relu(graph(gcn_w * x) + bias_cw); y = tcn_w *t y + tcn_b; out = relu(y + res)
# where graph(x)[c, t, w] = sum_k sum_v x[k, c, t, v] A_k[v, w] and the graph conv's bias and the
# BN after the graph step are carried into bias_cw (per output channel and joint).
@dataclass(frozen=True)
class FoldedBlock:
    gcn_weight: np.ndarray        # (K*C, Cin) 1x1 conv, post-graph BN scale folded in
    adjacency: np.ndarray         # (K, V, W) A * edge importance
    bias: np.ndarray              # (C, 1, W)
    tcn_weight: np.ndarray        # (C, C, 9, 1), the tcn BN folded in
    tcn_bias: np.ndarray          # (C,)
    stride: int
    residual: str                 # none | identity | conv
    res_weight: np.ndarray | None  # (C, Cin, 1, 1)
    res_bias: np.ndarray | None    # (C,)

    @property
    def partitions(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def channels(self) -> int:
        return int(self.tcn_weight.shape[0])


@dataclass(frozen=True)
class FoldedStream:
    in_scale: np.ndarray          # (C, 1, V, 1): data BN on (N, C, T, V, M)
    in_shift: np.ndarray
    blocks: tuple[FoldedBlock, ...]
    fc_weight: np.ndarray         # (num_class, last block's channels)
    fc_bias: np.ndarray


def _f64(state: dict[str, np.ndarray], key: str) -> np.ndarray:
    return np.asarray(state[key], dtype=np.float64)


def _bn_affine(state: dict[str, np.ndarray], p: str) -> tuple[np.ndarray, np.ndarray]:
    scale = _f64(state, p + "weight") / np.sqrt(_f64(state, p + "running_var") + BN_EPS)
    return scale, _f64(state, p + "bias") - _f64(state, p + "running_mean") * scale


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def fold_stream(state: dict[str, np.ndarray], prefix: str = "") -> FoldedStream:
    """Fold one stream (keys under `prefix`, e.g. "origin_stream.") of an original state."""
    p = prefix
    a = _f64(state, p + "A")
    k, v, _ = a.shape
    c_in = state[p + "data_bn.weight"].shape[0] // v
    scale, shift = _bn_affine(state, p + "data_bn.")
    # data_bn's channel index is v*C + c.
    in_scale = scale.reshape(v, c_in).T.reshape(c_in, 1, v, 1)
    in_shift = shift.reshape(v, c_in).T.reshape(c_in, 1, v, 1)
    blocks = []
    for i, (_cin, cout, stride, kind) in enumerate(block_channels(c_in, state_widths(state, p))):
        q = f"{p}st_gcn_networks.{i}."
        imp_key = f"{p}edge_importance.{i}"
        a_i = a * _f64(state, imp_key) if imp_key in state else a
        g_scale, g_shift = _bn_affine(state, q + "tcn.0.")
        gcn_w = _f64(state, q + "gcn.conv.weight")[:, :, 0, 0] * np.tile(g_scale, k)[:, None]
        gcn_b = _f64(state, q + "gcn.conv.bias").reshape(k, cout)
        bias_cw = g_scale[:, None] * np.einsum("kc,kw->cw", gcn_b, a_i.sum(axis=1)) \
            + g_shift[:, None]
        t_scale, t_shift = _bn_affine(state, q + "tcn.3.")
        tcn_w = _f64(state, q + "tcn.2.weight") * t_scale[:, None, None, None]
        tcn_b = _f64(state, q + "tcn.2.bias") * t_scale + t_shift
        res_w = res_b = None
        if kind == "conv":
            r_scale, r_shift = _bn_affine(state, q + "residual.1.")
            res_w = _f32(_f64(state, q + "residual.0.weight") * r_scale[:, None, None, None])
            res_b = _f32(_f64(state, q + "residual.0.bias") * r_scale + r_shift)
        blocks.append(FoldedBlock(_f32(gcn_w), _f32(a_i), _f32(bias_cw[:, None, :]),
                                  _f32(tcn_w), _f32(tcn_b), stride, kind, res_w, res_b))
    return FoldedStream(_f32(in_scale), _f32(in_shift), tuple(blocks),
                        _f32(_f64(state, p + "fcn.weight")[:, :, 0, 0]),
                        _f32(_f64(state, p + "fcn.bias")))


def fold_state(state: dict[str, np.ndarray]) -> tuple[FoldedStream, ...]:
    """(origin, motion) for a two-stream state, (stream,) for a single stream."""
    if "origin_stream.A" in state:
        return (fold_stream(state, "origin_stream."), fold_stream(state, "motion_stream."))
    return (fold_stream(state),)


# --- the numpy forward (the reference when torch is not installed) ---------------------------

def motion_np(x: np.ndarray, formula: str) -> np.ndarray:
    m = np.zeros_like(x)
    if formula == "first-difference":
        m[:, :, 1:] = x[:, :, 1:] - x[:, :, :-1]
    elif formula == "second-difference":
        m[:, :, 1:-1] = x[:, :, 1:-1] - 0.5 * x[:, :, 2:] - 0.5 * x[:, :, :-2]
    else:
        raise ValueError(f"unknown motion formula {formula!r}")
    return m


def _conv_t(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """(kt x 1) convolution over time, padding (kt-1)/2, channels last: one matrix product
    over (frame, joint) rows of the stacked kt-frame neighbourhoods (im2col)."""
    nm, _t, v, c = x.shape
    kt = w.shape[2]
    pad = (kt - 1) // 2
    xp = np.pad(x, ((0, 0), (pad, pad), (0, 0), (0, 0)))
    cols = np.lib.stride_tricks.sliding_window_view(xp, kt, axis=1)[:, ::stride]
    t_out = cols.shape[1]                                      # cols: (NM, T', V, C, kt)
    w2 = w[:, :, :, 0].reshape(w.shape[0], c * kt).T           # [(c, j), o]
    return (cols.reshape(nm * t_out * v, c * kt) @ w2 + b).reshape(nm, t_out, v, -1)


def _block(x: np.ndarray, blk: FoldedBlock) -> np.ndarray:
    """One block on channels-last features (NM, T, V, C)."""
    nm, t, v, c_in = x.shape
    k, c = blk.partitions, blk.channels
    g = (x.reshape(-1, c_in) @ blk.gcn_weight.T).reshape(nm * t, v, k, c)
    # out[w, c] = sum_(v, k) A[k, v, w] g[v, k, c]: one (W x V*K) matrix per frame.
    a2 = blk.adjacency.transpose(2, 1, 0).reshape(v, v * k)
    y = np.matmul(a2, g.reshape(nm * t, v * k, c)).reshape(nm, t, v, c)
    y = np.maximum(y + blk.bias[:, 0, :].T, 0)
    y = _conv_t(y, blk.tcn_weight, blk.tcn_bias, blk.stride)
    if blk.residual == "identity":
        y = y + x
    elif blk.residual == "conv":
        assert blk.res_weight is not None and blk.res_bias is not None
        xs = x[:, ::blk.stride]
        y = y + (xs.reshape(-1, c_in) @ blk.res_weight[:, :, 0, 0].T + blk.res_bias
                 ).reshape(y.shape)
    return np.maximum(y, 0)


def stream_logits(stream: FoldedStream, x: np.ndarray) -> np.ndarray:
    n, c, t, v, m = x.shape
    h = (x * stream.in_scale + stream.in_shift).transpose(0, 4, 2, 3, 1).reshape(n * m, t, v, c)
    for blk in stream.blocks:
        h = _block(np.ascontiguousarray(h), blk)
    pooled = h.mean(axis=(1, 2)).reshape(n, m, -1).mean(axis=1)
    return pooled @ stream.fc_weight.T + stream.fc_bias


def folded_logits(streams: tuple[FoldedStream, ...], x: np.ndarray,
                  motion_formula: str = "first-difference") -> np.ndarray:
    """Logits (N, num_class) of windows x (N, C, T, V, M), float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = stream_logits(streams[0], x)
    if len(streams) == 2:
        out = out + stream_logits(streams[1], motion_np(x, motion_formula))
    return out.astype(np.float32)
