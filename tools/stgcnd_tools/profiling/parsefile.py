"""`stgcnd trtexec parse`: any trtexec artefact (or a folder of them) to numbers and text
(`parse_path`, `render_text`, `write_derived`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stgcnd.errors import UserError
from stgcnd_tools.profiling.detect import detect_kind, scan_dir
from stgcnd_tools.profiling.layerinfo import load_layer_info
from stgcnd_tools.profiling.logparse import load_logish, write_metadata
from stgcnd_tools.profiling.profile import load_profile
from stgcnd_tools.profiling.times import (
    SERIES,
    SERIES_LABELS,
    load_times,
    summarize_times,
    write_times_outputs,
)
from stgcnd_tools.stats import TRTEXEC_KEYS
from stgcnd_tools.table import num, table


def parse_file(path: Path, *, kind: str | None = None, batch: int = 1, top: int = 10,
               count_types: Sequence[str] = ()) -> dict[str, Any]:
    kind = kind or detect_kind(path)
    entry: dict[str, Any] = {"path": str(path), "kind": kind}
    if kind == "times":
        entry["summary"] = summarize_times(load_times(path), batch)
    elif kind == "profile":
        data = load_profile(path).to_dict()
        data["per_layer"] = data["per_layer"][:top] if top else data["per_layer"]
        entry["profile"] = data
    elif kind == "layer_info":
        info = load_layer_info(path)
        data = info.to_dict()
        data.pop("per_layer")
        if count_types:
            data["requested_type_counts"] = info.count_types(count_types)
        entry["layer_info"] = data
    elif kind in ("log", "trex_profile_metadata", "trex_build_metadata"):
        parsed = load_logish([path], kind == "log")
        entry["log"] = parsed.to_dict() if kind == "log" else {
            "build_metadata": parsed.build_metadata(),
            "profile_metadata": parsed.profile_metadata()}
    elif kind in ("run_config", "engine_metadata"):
        entry[kind] = json.loads(path.read_text(encoding="utf-8"))
    return entry


def parse_path(path: str | Path, *, batch: int = 1, top: int = 10,
               count_types: Sequence[str] = ()) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        files = [(p, kind) for kind, paths in scan_dir(path).items() for p in paths]
        if not files:
            raise UserError(f"no trtexec artefacts recognised in {path}")
        files.sort(key=lambda pk: pk[0].name)
    elif path.is_file():
        kind = detect_kind(path)
        if kind == "unknown":
            raise UserError(f"{path} is not a trtexec artefact this tool recognises (exportTimes, "
                            "exportProfile, exportLayerInfo JSON or a trtexec log)")
        files = [(path, kind)]
    else:
        raise UserError(f"{path}: no such file or folder")
    return {"files": [parse_file(p, kind=k, batch=batch, top=top, count_types=count_types)
                      for p, k in files]}


def write_derived(path: str | Path, out_dir: str | Path, batch: int = 1) -> list[Path]:
    """Derived files for every times file and log found at `path` (file or folder)."""
    path, out = Path(path), Path(out_dir)
    found = scan_dir(path) if path.is_dir() else {detect_kind(path): [path]}
    written: list[Path] = []
    several = sum(len(found.get(k, [])) for k in ("times", "log")) > 1
    for kind in ("times", "log", "trex_profile_metadata", "trex_build_metadata"):
        for file in found.get(kind, []):
            target = out / file.stem if several else out
            if kind == "times":
                written += write_times_outputs(load_times(file), target, batch).values()
                continue
            written += write_metadata(load_logish([file], kind == "log"), target)
    return written


def _f(value: Any) -> str:
    return num(value, none="-")


def _render_entry(entry: dict[str, Any]) -> list[str]:
    lines = [f"{entry['path']}  [{entry['kind']}]"]
    if "summary" in entry:
        s = entry["summary"]
        thr = s["throughput"]
        lines.append(f"  {s['iterations']} iterations, batch {s['batch']}: "
                     f"{_f(thr['qps'])} qps, {_f(thr['windows_per_s'])} windows/s, "
                     f"GPU-bound {_f(thr['gpu_bound_qps'])} qps")
        lines += table(("ms", *TRTEXEC_KEYS), [(SERIES_LABELS[n], *(_f(s[n][k]) for k in
                                                                 TRTEXEC_KEYS))
                                              for n in SERIES if n in s], indent="  ", rule=False)
    if "profile" in entry:
        p = entry["profile"]
        lines.append(f"  {p['layers']} layers, {p['count'] or '?'} profiled iterations, summed "
                     f"average {_f(p['total_average_ms'])} ms"
                     + ("; repaired unescaped layer names" if p["repaired_invalid_json"] else "")
                     + ("" if p["has_median"] else "; no medians (TensorRT < 8.4)"))
        for row in p["per_layer"]:
            lines.append(f"  {row['rank']:>3}. {_f(row['average_ms']):>9} ms "
                         f"{row['share_percent']:5.1f}%  {row['name']}")
    if "layer_info" in entry:
        info = entry["layer_info"]
        lines.append(f"  {info['layers']} layers, {info['form'].replace('_', ' ')}, "
                     f"schema {info['schema']}")
        if info["type_counts"]:
            lines.append("  types: " + ", ".join(f"{t} {c}" for t, c in
                                                info["type_counts"].items()))
        if info.get("requested_type_counts"):
            lines.append("  requested: " + ", ".join(
                f"{t} {c}" for t, c in info["requested_type_counts"].items()))
        if info["precision_counts"]:
            lines.append("  output precisions: " + ", ".join(
                f"{p} {c}" for p, c in info["precision_counts"].items()))
        if info["io_tensors"]:
            lines.append("  I/O: " + ", ".join(str(t["name"]) for t in info["io_tensors"]))
    if "log" in entry:
        lines += _render_log(entry["log"])
    for key in ("run_config", "engine_metadata"):
        if key in entry:
            data = entry[key]
            lines.append("  " + (data.get("command_line") or data.get("path") or ""))
    return lines


def _render_log(data: dict[str, Any]) -> list[str]:
    build, prof = data["build_metadata"], data["profile_metadata"]
    lines = []
    version = build.get("tensorrt_version") or prof.get("tensorrt_version")
    device = (build.get("device_information") or prof.get("device_information") or {}) \
        .get("Selected Device")
    lines.append(f"  TensorRT {version or '?'}, device {device or '?'}, "
                 f"status {data.get('status') or '?'}")
    if build.get("command"):
        lines.append(f"  command: {build['command']}")
    perf = prof.get("performance_summary") or {}
    if perf.get("throughput_qps") is not None:
        lines.append(f"  throughput {_f(perf['throughput_qps'])} qps")
    for name, stats in (perf.get("metrics_ms") or {}).items():
        lines.append(f"  {name:<26}" + " ".join(f"{k}={_f(v)}" for k, v in stats.items()))
    for key, value in (build.get("build") or {}).items():
        lines.append(f"  {key}: {_f(value)}")
    if data.get("warnings"):
        lines.append(f"  {len(data['warnings'])} warning(s); first: {data['warnings'][0]}")
    return lines


def render_text(parsed: dict[str, Any]) -> str:
    blocks = ["\n".join(_render_entry(entry)) for entry in parsed["files"]]
    return "\n\n".join(blocks) + "\n"
