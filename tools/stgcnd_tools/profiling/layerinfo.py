"""Engine layer information from `trtexec --exportLayerInfo` (IEngineInspector JSON), names
only or detailed, TensorRT 8.x-11.x (docs/trtexec.md, "What each parser reads")."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stgcnd_tools.profiling.detect import read_artefact

# Data type tokens as they appear in "Format/Datatype" strings and 11.x "DataType" values.
_PRECISION_PATTERNS = (
    ("FP32", re.compile(r"\bFP32\b|^Float$|\bkFLOAT\b", re.IGNORECASE)),
    ("FP16", re.compile(r"\bFP16\b|^Half$|\bkHALF\b", re.IGNORECASE)),
    ("BF16", re.compile(r"\bBF16\b|^BFloat16$|\bkBF16\b", re.IGNORECASE)),
    ("FP8", re.compile(r"\bFP8\b|^FP8$|\bkFP8\b|E4M3", re.IGNORECASE)),
    ("FP4", re.compile(r"\bFP4\b|\bkFP4\b|E2M1", re.IGNORECASE)),
    ("INT8", re.compile(r"\bInt8\b|\bkINT8\b", re.IGNORECASE)),
    ("INT4", re.compile(r"\bInt4\b|\bkINT4\b", re.IGNORECASE)),
    ("INT32", re.compile(r"\bInt32\b|\bkINT32\b", re.IGNORECASE)),
    ("INT64", re.compile(r"\bInt64\b|\bkINT64\b", re.IGNORECASE)),
    ("BOOL", re.compile(r"\bBool\b|\bkBOOL\b", re.IGNORECASE)),
    ("UINT8", re.compile(r"\bUInt8\b|\bkUINT8\b", re.IGNORECASE)),
)


def precision_of(format_or_type: str | None) -> str | None:
    """Normalised data type (FP32, FP16, INT8, ...) of an inspector format/type string."""
    if not format_or_type:
        return None
    text = format_or_type.strip()
    for name, pattern in _PRECISION_PATTERNS:
        if pattern.search(text):
            return name
    return None


def _tensor_precision(tensor: dict[str, Any]) -> str | None:
    for key in ("DataType", "Datatype", "Format/Datatype", "Format"):
        found = precision_of(tensor.get(key) if isinstance(tensor.get(key), str) else None)
        if found:
            return found
    return None


@dataclass(frozen=True)
class LayerEntry:
    name: str
    layer_type: str | None = None
    tactic_name: str | None = None
    output_precision: str | None = None
    origin: str | None = None
    stream_id: int | None = None
    metadata: str | None = None


@dataclass
class LayerInfo:
    form: str  # "names_only" | "detailed"
    schema: str  # "8.x-10.x" (Bindings) | "11.x" (I/O Tensors) | "unknown"
    layers: list[LayerEntry] = field(default_factory=list)
    io_tensors: list[dict[str, Any]] = field(default_factory=list)

    def type_counts(self) -> Counter[str]:
        return Counter(layer.layer_type for layer in self.layers if layer.layer_type)

    def count_types(self, names: Iterable[str]) -> dict[str, int]:
        """Counts of the named LayerTypes, 0 for absent ones (case-insensitive match)."""
        lowered = Counter({k.lower(): v for k, v in self.type_counts().items()})
        return {name: lowered.get(name.lower(), 0) for name in names}

    def precision_counts(self) -> Counter[str]:
        return Counter(layer.output_precision for layer in self.layers if layer.output_precision)

    def layer_types(self) -> dict[str, str]:
        return {layer.name: layer.layer_type for layer in self.layers if layer.layer_type}

    def to_dict(self) -> dict[str, Any]:
        return {
            "form": self.form, "schema": self.schema, "layers": len(self.layers),
            "type_counts": dict(self.type_counts().most_common()),
            "precision_counts": dict(self.precision_counts().most_common()),
            "streams": sorted({la.stream_id for la in self.layers if la.stream_id is not None}),
            "io_tensors": self.io_tensors,
            "per_layer": [
                {"name": la.name, "type": la.layer_type, "precision": la.output_precision,
                 "tactic": la.tactic_name, "origin": la.origin, "stream_id": la.stream_id,
                 "metadata": la.metadata}
                for la in self.layers
            ],
        }


def _entry(raw: Any) -> LayerEntry:
    if isinstance(raw, str):
        return LayerEntry(name=raw)
    outputs = raw.get("Outputs") or []
    precision = next((p for p in (_tensor_precision(t) for t in outputs if isinstance(t, dict))
                      if p), None)
    stream = raw.get("StreamId")
    metadata = raw.get("Metadata")
    return LayerEntry(
        name=str(raw.get("Name", "")),
        layer_type=raw.get("LayerType") or raw.get("ParameterType"),
        tactic_name=raw.get("TacticName"),
        output_precision=precision,
        origin=raw.get("Origin"),
        stream_id=int(stream) if isinstance(stream, (int, float)) else None,
        # Metadata separates ONNX node names with U+001E (record separator).
        metadata=metadata.replace("\x1e", "; ") if isinstance(metadata, str) else None,
    )


def _io_tensors(data: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    if "I/O Tensors" in data:
        tensors = []
        for t in data["I/O Tensors"]:
            if isinstance(t, dict):
                tensors.append({"name": t.get("Name"), "mode": t.get("IOMode"),
                                "dtype": t.get("DataType"), "dims": t.get("Dimensions"),
                                "location": t.get("Location")})
        return "11.x", tensors
    if "Bindings" in data:
        return "8.x-10.x", [{"name": name} for name in data["Bindings"]]
    return "unknown", []


def parse_layer_info(data: Any) -> LayerInfo:
    if not isinstance(data, dict) or not isinstance(data.get("Layers"), list):
        raise ValueError('layer info JSON must be an object with a "Layers" array')
    layers = [_entry(raw) for raw in data["Layers"] if isinstance(raw, (str, dict))]
    detailed = any(isinstance(raw, dict) for raw in data["Layers"])
    schema, tensors = _io_tensors(data)
    return LayerInfo(form="detailed" if detailed else "names_only", schema=schema,
                     layers=layers, io_tensors=tensors)


def load_layer_info(path: str | Path) -> LayerInfo:
    return read_artefact(path, lambda text: parse_layer_info(json.loads(text)),
                         "trtexec layer info", "exportLayerInfo")
