"""Say what a file given as a checkpoint actually is, for errors a user can act on.

`torch.load`'s own errors describe its internals; these helpers name the thing in words ("an
ONNX model", "a PyTorch file holding a list of 3 items").
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

# What a loadable checkpoint looks like, for the "expected" half of every message.
EXPECTED = ("expected an st-gcn state_dict, as torch.save(model.state_dict(), path) writes it, "
            "with keys like origin_stream.data_bn.weight and motion_stream.fcn.weight "
            "(two-stream) or data_bn.weight and fcn.weight (single stream)")

_HEAD_BYTES = 4096
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


def describe_unreadable(path: Path) -> str:
    """What `path` is, from its bytes; used when torch.load failed on it."""
    size = path.stat().st_size
    if size == 0:
        return "an empty file (0 bytes)"
    with path.open("rb") as fh:
        head = fh.read(_HEAD_BYTES)
    if head.startswith(b"PK\x03\x04"):
        return _describe_zip(path)
    if head.startswith(_LFS_POINTER):
        return "a Git LFS pointer, not the file itself: fetch it with `git lfs pull`"
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy .npy array (np.save), not a PyTorch file"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "an HDF5 file (e.g. Keras weights), not a PyTorch file"
    if head.startswith(b"\x1f\x8b"):
        return "a gzip-compressed file: decompress it first (gunzip)"
    if _looks_like_onnx(path, head):
        return ("an ONNX model: stgcnd needs the PyTorch checkpoint it was exported from (it "
                "exports its own ONNX); to time this file with trtexec use "
                "`stgcnd trtexec run --onnx PATH`")
    if b"ftrt" in head[:32] or b"ptrt" in head[:32]:
        return ("a TensorRT engine: engines are built from the PyTorch checkpoint "
                "(`stgcnd build --checkpoint ...`)")
    text = _as_text(head)
    if text is not None:
        start = " ".join(text.split())[:24]
        more = "…" if len(" ".join(text.split())) > 24 else ""
        return f"a text file, not a PyTorch file: it starts with {start + more!r}"
    if head[:1] == b"\x80":
        return (f"a Python pickle torch cannot read as a checkpoint ({size} bytes; truncated, "
                "or written by pickle rather than torch.save)")
    return (f"not a PyTorch file: {size} bytes of binary data starting with "
            f"{head[:8].hex(' ')}")


def _describe_zip(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile:
        return "a truncated or corrupt zip archive (PyTorch files are zip archives)"
    if any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        return "a PyTorch zip file that torch cannot read: truncated or corrupt"
    if names and all(n.endswith(".npy") for n in names):
        arrays = ", ".join(n[:-4] for n in names[:5])
        return f"a NumPy .npz archive (arrays: {arrays}{', …' if len(names) > 5 else ''})"
    listed = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
    return ("a zip archive without data.pkl, so not a PyTorch file "
            f"(it holds: {listed or 'nothing'})")


def _looks_like_onnx(path: Path, head: bytes) -> bool:
    if path.suffix.lower() == ".onnx":
        return True
    # ModelProto starts with ir_version (field 1, varint: byte 0x08) and names its producer
    # (field 2) or opset (field 8); a checkpoint never does.
    return head[:1] == b"\x08" and len(head) > 2 and head[1] < 0x80 and \
        head[2:3] in (b"\x12", b"\x1a", b"\x22", b"\x2a", b"\x3a", b"\x42")


def _as_text(head: bytes) -> str | None:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        # A multi-byte character cut at the end of the head is still text.
        try:
            text = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return None
    printable = sum(ch.isprintable() or ch in "\t\r\n" for ch in text)
    return text if text and printable >= 0.95 * len(text) else None


def describe_object(obj: Any) -> str:
    """What a torch.load result is, e.g. 'a PyTorch file holding a list of 3 items'."""
    if isinstance(obj, torch.Tensor):
        return f"a PyTorch file holding a single tensor of shape {tuple(obj.shape)}"
    if isinstance(obj, Mapping):
        keys = [str(k) for k in obj]
        tensors = sum(isinstance(v, torch.Tensor) for v in obj.values())
        listed = ", ".join(keys[:5]) + ("…" if len(keys) > 5 else "")
        if not keys:
            return f"a PyTorch file holding an empty {type(obj).__name__}"
        which = "none of them tensors" if not tensors else f"{_count(tensors, 'tensor')}"
        return (f"a PyTorch file holding a {type(obj).__name__} with "
                f"{_count(len(keys), 'key')} ({which}): {listed}")
    if isinstance(obj, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in obj})
        return (f"a PyTorch file holding a {type(obj).__name__} of {_count(len(obj), 'item')}"
                + (f" ({', '.join(kinds)})" if kinds else ""))
    return f"a PyTorch file holding a {type(obj).__name__}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def nested_state_dicts(obj: Any) -> list[tuple[str, int]]:
    """Keys of `obj` whose values are mappings of tensors (a state_dict under another name)."""
    if not isinstance(obj, Mapping):
        return []
    found = []
    for key, value in obj.items():
        if isinstance(value, Mapping):
            tensors = sum(isinstance(v, torch.Tensor) for v in value.values())
            if tensors:
                found.append((str(key), tensors))
    return found
