"""Cache keys: what an artefact was built from, and in words what changed since."""

from __future__ import annotations

import hashlib
import json
from typing import Any

KEY_FORMAT = "stgcnd-engine-key/1"


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def key_digest(parts: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


def make_key_parts(*, onnx_sha256: str, backend: str, backend_version: str | None,
                   device: dict[str, Any], options: dict[str, Any],
                   input_shape: list[int], batch_range: list[int],
                   runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    parts = {"format": KEY_FORMAT, "onnx_sha256": onnx_sha256, "backend": backend,
             "backend_version": backend_version, "device": device, "options": options,
             "input_shape": list(input_shape), "batch_range": list(batch_range)}
    if runtime:  # only when there is something: other backends' keys stay as they were
        parts["runtime"] = runtime
    return parts


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def _short(v: Any) -> str:
    s = str(v)
    return s[:12] if isinstance(v, str) and len(s) == 64 else s  # sha256 -> 12 hex digits


def describe_key_change(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each differing leaf as 'path: old -> new', e.g. 'backend_version: 8.6.1 -> 10.3.0'."""
    a, b = _flatten(old), _flatten(new)
    return [f"{k}: {_short(a.get(k))} -> {_short(b.get(k))}"
            for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
