"""Loading st-gcn checkpoints strictly, with errors that say what went wrong.

Accepted: a plain state_dict as the original code saves it; the same with a `module.` prefix
(DataParallel); either wrapped under a `state_dict` or `model` key; two-stream
(`origin_stream.*`, `motion_stream.*`) or single-stream (`A`, `data_bn.*`, ...) networks.
num_class, the partitions K and the joints V come from the checkpoint, and so does A.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stgcnd.errors import CheckpointError
from stgcnd.model.architecture import WIDTHS, state_widths
from stgcnd.model.filekind import (
    EXPECTED,
    describe_object,
    describe_unreadable,
    nested_state_dicts,
)
from stgcnd.model.layouts import LAYOUTS
from stgcnd.model.spec import check_labels

STREAMS = ("origin_stream", "motion_stream")
WRAPPERS = ("state_dict", "model", "model_state_dict")  # keys a state_dict is often saved under
_OPTIONAL_SUFFIX = "num_batches_tracked"  # absent from checkpoints saved by torch < 0.4.1


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint says about its network."""

    two_stream: bool
    num_class: int
    partitions: int
    num_node: int
    in_channels: int
    edge_importance: bool
    adjacency: dict[str, torch.Tensor]  # stream prefix ("" for single stream) -> A
    widths: tuple[int, ...] = WIDTHS    # each block's output channels


def read_state_dict(path: Path | str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, unwrapped and without a DataParallel prefix."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path} (check the path in --checkpoint or "
                              "the model's `checkpoint` setting)")
    try:
        with warnings.catch_warnings():
            # torch 2.0/2.1 (JetPack 5) warn of their own TypedStorage use inside a
            # weights-only load: a warning in the daemon's log that no user can act on.
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated",
                                    category=UserWarning)
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for bad files; all mean "unreadable"
        if "Unsupported global" in str(exc):  # a pickled object, not tensors
            raise CheckpointError(
                f"{path} holds Python objects other than tensors (e.g. a whole pickled model); "
                "re-save it as a plain state_dict: torch.save(model.state_dict(), path)") from None
        # torch's message describes its internals ("KeyError: 101"): say what the file is.
        raise CheckpointError(f"cannot read {path}: it is {describe_unreadable(path)}; "
                              f"{EXPECTED}") from None
    for wrapper in WRAPPERS:
        if isinstance(obj, Mapping) and isinstance(obj.get(wrapper), Mapping):
            obj = obj[wrapper]
            break
    tensors = isinstance(obj, Mapping) and any(isinstance(v, torch.Tensor) for v in obj.values())
    if not tensors:
        nested = nested_state_dicts(obj)
        if nested:
            key, count = nested[0]
            raise CheckpointError(
                f"{path} is {describe_object(obj)}; its key {key!r} holds "
                f"{count} tensor{'' if count == 1 else 's'}, but "
                f"stgcnd unwraps only {', '.join(map(repr, WRAPPERS))}: re-save that part with "
                f"torch.save(torch.load(path)[{key!r}], 'state_dict.pt')")
        raise CheckpointError(f"{path} is {describe_object(obj)}; {EXPECTED}")
    state = {str(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def inspect_state_dict(state: Mapping[str, torch.Tensor], source: str = "checkpoint"
                       ) -> CheckpointInfo:
    """Recognise the architecture and read num_class, K, V and A from the tensors."""
    if all(f"{s}.A" in state for s in STREAMS):
        prefixes = [f"{s}." for s in STREAMS]
    elif "A" in state and "fcn.weight" in state:
        prefixes = [""]
    else:
        keys = sorted(state)
        sample = ", ".join(keys[:5]) + (", …" if len(keys) > 5 else "")
        hint = ""
        if any(k.startswith("origin_stream.") for k in state) != any(
                k.startswith("motion_stream.") for k in state):
            hint = " One of the two streams is missing."
        raise CheckpointError(
            f"{source} is not an st-gcn model: expected keys 'origin_stream.A' and "
            f"'motion_stream.A' (two-stream) or 'A' and 'fcn.weight' (single stream), found "
            f"{len(keys)} tensors: {sample}.{hint} Another architecture (e.g. 2s-AGCN, CTR-GCN, "
            "MS-G3D) needs its own model code.")
    p0 = prefixes[0]
    a = state[f"{p0}A"]
    if a.dim() != 3 or a.shape[1] != a.shape[2]:
        raise CheckpointError(f"{source}: {p0}A has shape {tuple(a.shape)}, expected (K, V, V)")
    fcn = state.get(f"{p0}fcn.weight")
    bn = state.get(f"{p0}data_bn.weight")
    if fcn is None or bn is None:
        raise CheckpointError(f"{source}: missing {p0}fcn.weight or {p0}data_bn.weight")
    k, v = int(a.shape[0]), int(a.shape[1])
    if bn.numel() % v:
        raise CheckpointError(f"{source}: data_bn has {bn.numel()} channels, not a multiple of "
                              f"V={v} joints")
    return CheckpointInfo(
        two_stream=len(prefixes) == 2,
        num_class=int(fcn.shape[0]),
        partitions=k,
        num_node=v,
        in_channels=bn.numel() // v,
        edge_importance=f"{p0}edge_importance.0" in state,
        adjacency={p: state[f"{p}A"] for p in prefixes},
        widths=state_widths(state, p0),
    )


def layouts_with(num_node: int) -> list[str]:
    return [name for name, lay in LAYOUTS.items() if lay.num_node == num_node]


def load_strict(module: torch.nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """load_state_dict, with one error naming every missing, unexpected or mis-shaped key."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in state and not k.endswith(_OPTIONAL_SUFFIX)]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
              for k, v in expected.items() if k in state and state[k].shape != v.shape]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys ({', '.join(missing[:6])}"
                         f"{', ...' if len(missing) > 6 else ''})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} keys ({', '.join(unexpected[:6])}"
                         f"{', ...' if len(unexpected) > 6 else ''})")
        if shapes:
            parts.append("shape mismatch: " + "; ".join(shapes[:4]))
        raise CheckpointError(
            f"{source} does not match the st-gcn architecture: " + "; ".join(parts) +
            ". Likely causes: a model with another number of blocks or channels, edge "
            "importance off, or another architecture.")
    full = dict(state)
    for k, v in expected.items():
        full.setdefault(k, v)  # only num_batches_tracked can be absent here
    module.load_state_dict(full, strict=True)


def check_against_spec(info: CheckpointInfo, layout: str, labels: tuple[str, ...],
                       source: str) -> None:
    want_v = LAYOUTS[layout].num_node
    if info.num_node != want_v:
        fits = layouts_with(info.num_node)
        fix = (f"use --layout {' or '.join(fits)}" if fits
               else f"no built-in layout has {info.num_node} joints")
        raise CheckpointError(f"{source} was trained on {info.num_node} joints but layout "
                              f"{layout!r} has {want_v}: {fix}")
    check_labels(labels, info.num_class, source)
    if info.in_channels != 3:
        fold = ""
        if info.in_channels % 3 == 0:
            # The original st-gcn's data_bn normalizes V*C features; some forks (2s-AGCN's
            # style) normalize M*V*C, which reads here as M times the channels.
            fold = (f". If it was trained for {info.in_channels // 3} persons, its data_bn "
                    "normalizes persons x joints x 3 (a fork's person-count fold); stgcnd "
                    "reads the original st-gcn's data_bn over joints x 3 only: retrain with "
                    "the original's data_bn, or open an issue naming the fork")
        raise CheckpointError(f"{source} expects {info.in_channels} input channels; stgcnd feeds "
                              f"3 (x, y, visibility){fold}")


def describe(info: CheckpointInfo) -> dict[str, Any]:
    return {"two_stream": info.two_stream, "num_class": info.num_class,
            "partitions": info.partitions, "num_node": info.num_node,
            "edge_importance": info.edge_importance}
