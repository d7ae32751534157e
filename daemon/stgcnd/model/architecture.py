"""The ST-GCN architecture as plain data: block table and state_dict layout, without torch.

stgcn.py builds the PyTorch network from this table; the demo model's numpy weights and its
numpy-built ONNX graph (stgcnd.export.demo_onnx) use it where torch may not be installed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# (in_channels, out_channels, temporal stride, residual) of the 10 blocks; in_channels of block 0
# is the number of input channels (3: x, y, visibility).
BLOCKS: tuple[tuple[int | None, int, int, bool], ...] = (
    (None, 64, 1, False), (64, 64, 1, True), (64, 64, 1, True), (64, 64, 1, True),
    (64, 128, 2, True), (128, 128, 1, True), (128, 128, 1, True),
    (128, 256, 2, True), (256, 256, 1, True), (256, 256, 1, True),
)
WIDTHS: tuple[int, ...] = tuple(cout for _cin, cout, _stride, _residual in BLOCKS)
TEMPORAL_KERNEL = 9
BN_EPS = 1e-5


def block_channels(in_channels: int, widths: Sequence[int] = WIDTHS
                   ) -> list[tuple[int, int, int, str]]:
    """(cin, cout, stride, residual kind) per block; kind is none | identity | conv. `widths`
    are the blocks' output channels: the original's, or a checkpoint's own (`state_widths`)."""
    out = []
    cin = in_channels
    for (_cin, _cout, stride, residual), cout in zip(BLOCKS, widths):
        kind = "none" if not residual else (
            "identity" if cin == cout and stride == 1 else "conv")
        out.append((cin, cout, stride, kind))
        cin = cout
    return out


def state_widths(state: Mapping[str, Any], prefix: str = "") -> tuple[int, ...]:
    """Each block's output channels as a stream's tensors (under `prefix`) hold them. The same
    blocks with fewer channels load too (the tests' narrow network: every code path at a
    fraction of the CPU time); a block whose key is missing keeps the original's width, and
    the strict load names the key."""
    keys = (f"{prefix}st_gcn_networks.{i}.tcn.2.bias" for i in range(len(BLOCKS)))
    return tuple(int(state[k].shape[0]) if k in state else w for k, w in zip(keys, WIDTHS))


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
        keys += [(f"edge_importance.{i}", (k, v, v)) for i in range(len(BLOCKS))]
    keys += [("fcn.weight", (num_class, widths[-1], 1, 1)), ("fcn.bias", (num_class,))]
    return keys
