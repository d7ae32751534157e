"""Per-layer times from `trtexec --exportProfile` (docs/trtexec.md, "What each parser
reads"): trtexec writes layer names unescaped, so invalid JSON is re-read field by field."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stgcnd_tools.profiling.detect import read_artefact

_RECORD_START = re.compile(r'\{\s*"name"\s*:\s*"')
# A name ends at the first `", "timeMs" :` after it: the next field the writer prints.
_NAME_END = re.compile(r'"\s*,\s*"timeMs"\s*:')
_NUMBER_FIELD = re.compile(r'"(timeMs|averageMs|medianMs|percentage)"\s*:\s*'
                           r'([-+0-9.eE]+|nan|inf|-inf)')
_COUNT = re.compile(r'\{\s*"count"\s*:\s*(\d+)\s*\}')


@dataclass(frozen=True)
class LayerTime:
    name: str
    total_ms: float
    average_ms: float
    median_ms: float | None


@dataclass
class LayerProfile:
    """Per-layer times of one profiling run; `count` = profiled iterations (None if unknown)."""

    count: int | None
    layers: list[LayerTime] = field(default_factory=list)
    repaired: bool = False  # True when the file was not valid JSON (unescaped names)

    @property
    def total_average_ms(self) -> float:
        return sum(layer.average_ms for layer in self.layers)

    @property
    def has_median(self) -> bool:
        return any(layer.median_ms is not None for layer in self.layers)

    def to_dict(self, layer_types: dict[str, str] | None = None) -> dict[str, Any]:
        """The layers slowest first; shares of the summed average time (recomputed, not the
        file's `percentage`)."""
        total, types = self.total_average_ms, layer_types or {}
        rows = [{"rank": rank, "name": la.name, "type": types.get(la.name),
                 "average_ms": la.average_ms, "median_ms": la.median_ms, "total_ms": la.total_ms,
                 "share_percent": 100.0 * la.average_ms / total if total > 0 else 0.0}
                for rank, la in enumerate(sorted(self.layers, key=lambda la: -la.average_ms), 1)]
        return {"count": self.count, "layers": len(self.layers),
                "total_average_ms": self.total_average_ms, "has_median": self.has_median,
                "repaired_invalid_json": self.repaired, "per_layer": rows}


def _from_objects(items: list[Any]) -> LayerProfile:
    count: int | None = None
    layers: list[LayerTime] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if "count" in item and "name" not in item:
            count = int(item["count"])
            continue
        if "name" not in item:
            continue
        total = float(item.get("timeMs", 0.0))
        average = item.get("averageMs")
        median = item.get("medianMs")
        layers.append(LayerTime(
            name=str(item["name"]), total_ms=total,
            average_ms=float(average) if average is not None else total / max(count or 1, 1),
            median_ms=float(median) if median is not None else None))
    return LayerProfile(count=count, layers=layers)


def _repair(text: str) -> list[dict[str, Any]]:
    """Read records whose names were written unescaped, field by field."""
    items: list[dict[str, Any]] = []
    count = _COUNT.search(text)
    if count:
        items.append({"count": int(count.group(1))})
    for start in _RECORD_START.finditer(text):
        end = _NAME_END.search(text, start.end())
        if not end:
            continue
        name = text[start.end():end.start()]
        close = text.find("}", end.end())
        body = text[end.start():close if close >= 0 else len(text)]
        record: dict[str, Any] = {"name": name}
        for key, value in _NUMBER_FIELD.findall(body):
            record[key] = float(value)
        items.append(record)
    return items


def parse_profile_text(text: str) -> LayerProfile:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        profile = _from_objects(_repair(text))
        profile.repaired = True
    else:
        if not isinstance(data, list):
            raise ValueError("exportProfile JSON must be an array")
        profile = _from_objects(data)
    if not profile.layers:
        raise ValueError("no per-layer records found")
    return profile


def load_profile(path: str | Path) -> LayerProfile:
    return read_artefact(path, parse_profile_text, "a trtexec layer profile", "exportProfile")
