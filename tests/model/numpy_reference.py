"""An independent numpy implementation of the st-gcn forward pass, written from the paper's
and original code's definitions, used to check the torch model on original-format weights."""

from __future__ import annotations

import numpy as np


def _np(state, key):
    value = state[key]  # a torch tensor, or a numpy array (the torch-free demo weights)
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def _bn(x, state, p, axis):
    g, b = _np(state, p + "weight"), _np(state, p + "bias")
    mu, var = _np(state, p + "running_mean"), _np(state, p + "running_var")
    shape = [1] * x.ndim
    shape[axis] = -1
    return (x - mu.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-5) * g.reshape(shape) \
        + b.reshape(shape)


def _oc_nctv(w, x):
    """einsum("oc,nctv->notv", w, x) as one BLAS matrix product: seconds, not minutes, for
    real-shaped windows (T=150, M=5)."""
    return np.tensordot(w, x, axes=([1], [1])).transpose(1, 0, 2, 3)


def _conv1x1(x, w, b, stride=1):  # x (n, c, t, v); w (o, c, 1, 1)
    y = _oc_nctv(w[:, :, 0, 0], x[:, :, ::stride])
    return y + b[None, :, None, None]


def _tconv(x, w, b, stride):  # w (o, c, 9, 1), padding 4
    kt = w.shape[2]
    pad = (kt - 1) // 2
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (0, 0)))
    t_out = (x.shape[2] + 2 * pad - kt) // stride + 1
    y = np.zeros((x.shape[0], w.shape[0], t_out, x.shape[3]))
    for j in range(kt):
        sl = xp[:, :, j: j + stride * (t_out - 1) + 1: stride]
        y += _oc_nctv(w[:, :, j, 0], sl)
    return y + b[None, :, None, None]


def stream_forward(state, x, prefix=""):
    p = prefix
    n, c, t, v, m = x.shape
    a = _np(state, p + "A")
    k = a.shape[0]
    # data_bn over channel index v*C + c
    xb = x.transpose(0, 4, 3, 1, 2).reshape(n * m, v * c, t)
    xb = _bn(xb, state, p + "data_bn.", axis=1)
    h = xb.reshape(n, m, v, c, t).transpose(0, 1, 3, 4, 2).reshape(n * m, c, t, v)
    strides = [1, 1, 1, 1, 2, 1, 1, 2, 1, 1]
    for i, s in enumerate(strides):
        q = f"{p}st_gcn_networks.{i}."
        imp = _np(state, f"{p}edge_importance.{i}") if f"{p}edge_importance.{i}" in state else 1.0
        g = _conv1x1(h, _np(state, q + "gcn.conv.weight"), _np(state, q + "gcn.conv.bias"))
        nm, kc, tt, vv = g.shape
        g = np.einsum("nkctv,kvw->nctw", g.reshape(nm, k, kc // k, tt, vv), a * imp,
                      optimize=True)
        y = np.maximum(_bn(g, state, q + "tcn.0.", axis=1), 0)
        y = _tconv(y, _np(state, q + "tcn.2.weight"), _np(state, q + "tcn.2.bias"), s)
        y = _bn(y, state, q + "tcn.3.", axis=1)
        if i == 0:
            res = 0.0
        elif q + "residual.0.weight" in state:
            res = _bn(_conv1x1(h, _np(state, q + "residual.0.weight"),
                               _np(state, q + "residual.0.bias"), s), state, q + "residual.1.",
                      axis=1)
        else:
            res = h
        h = np.maximum(y + res, 0)
    pooled = h.mean(axis=(2, 3)).reshape(n, m, -1).mean(axis=1)
    w = _np(state, p + "fcn.weight")[:, :, 0, 0]
    return pooled @ w.T + _np(state, p + "fcn.bias")


def motion_np(x, formula):
    m = np.zeros_like(x)
    if formula == "first-difference":
        m[:, :, 1:] = x[:, :, 1:] - x[:, :, :-1]
    else:
        m[:, :, 1:-1] = x[:, :, 1:-1] - 0.5 * x[:, :, 2:] - 0.5 * x[:, :, :-2]
    return m


def two_stream_forward(state, x, formula="first-difference"):
    x = np.asarray(x, dtype=np.float64)
    return (stream_forward(state, x, "origin_stream.")
            + stream_forward(state, motion_np(x, formula), "motion_stream."))
