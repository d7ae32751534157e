"""The ST-GCN architecture as plain data, without torch: the block table stgcn.py builds the
network from, and the state_dict layout the demo's numpy weights and ONNX graph are drawn in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Sized

# The 10 blocks' output channels, temporal strides and residuals (block 0 takes x, y, visibility)
WIDTHS: tuple[int, ...] = (64, 64, 64, 64, 128, 128, 128, 256, 256, 256)
STRIDES = (1, 1, 1, 1, 2, 1, 1, 2, 1, 1)
RESIDUAL = (False,) + (True,) * 9
TEMPORAL_KERNEL = 9
BN_EPS = 1e-5


def block_channels(in_channels: int, widths: Sequence[int] = WIDTHS
                   ) -> list[tuple[int, int, int, str]]:
    """(cin, cout, stride, residual kind: none | identity | conv) per block of `widths`."""
    return [(cin, cout, stride, "none" if not res else
             "identity" if cin == cout and stride == 1 else "conv")
            for cin, cout, stride, res in zip((in_channels, *widths), widths, STRIDES, RESIDUAL)]


def state_widths(state: Mapping[str, Sized], prefix: str = "") -> tuple[int, ...]:
    """Each block's output channels in a stream's tensors (a missing key: the original's)."""
    keys = (f"{prefix}st_gcn_networks.{i}.tcn.2.bias" for i in range(len(WIDTHS)))
    return tuple(len(state[k]) if k in state else w for k, w in zip(keys, WIDTHS))


def _bn(prefix: str, channels: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{prefix}weight", (channels,)), (f"{prefix}bias", (channels,)),
            (f"{prefix}running_mean", (channels,)), (f"{prefix}running_var", (channels,)),
            (f"{prefix}num_batches_tracked", ())]


def stream_state_layout(partitions: int, num_node: int, num_class: int, in_channels: int = 3,
                        edge_importance: bool = True, widths: Sequence[int] = WIDTHS
                        ) -> list[tuple[str, tuple[int, ...]]]:
    """(key, shape) of one stream's state_dict, in the order PyTorch's state_dict() lists them
    (own buffers, then children in registration order). The demo weights are drawn in this
    order, so it must not change (tests compare it with the torch module's own list)."""
    k, v = partitions, num_node
    keys: list[tuple[str, tuple[int, ...]]] = [("A", (k, v, v))]
    keys += _bn("data_bn.", in_channels * v)
    for i, (cin, cout, _stride, kind) in enumerate(block_channels(in_channels, widths)):
        p = f"st_gcn_networks.{i}."
        keys += [(f"{p}gcn.conv.weight", (cout * k, cin, 1, 1)), (f"{p}gcn.conv.bias", (cout * k,))]
        keys += _bn(f"{p}tcn.0.", cout)
        keys += [(f"{p}tcn.2.weight", (cout, cout, TEMPORAL_KERNEL, 1)),
                 (f"{p}tcn.2.bias", (cout,))]
        keys += _bn(f"{p}tcn.3.", cout)
        if kind == "conv":
            keys += [(f"{p}residual.0.weight", (cout, cin, 1, 1)), (f"{p}residual.0.bias", (cout,))]
            keys += _bn(f"{p}residual.1.", cout)
    if edge_importance:
        keys += [(f"edge_importance.{i}", (k, v, v)) for i in range(len(widths))]
    keys += [("fcn.weight", (num_class, widths[-1], 1, 1)), ("fcn.bias", (num_class,))]
    return keys
