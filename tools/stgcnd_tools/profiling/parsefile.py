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
from stgcnd_tools.profiling.facts import facts, to_text
from stgcnd_tools.profiling.layerinfo import load_layer_info
from stgcnd_tools.profiling.logparse import load_logish, write_metadata
from stgcnd_tools.profiling.profile import load_profile
from stgcnd_tools.profiling.times import load_times, summarize_times, write_times_outputs


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


def entry_run(entry: dict[str, Any]) -> dict[str, Any]:
    """One file's entry as a run section (report.run_section's keys), for profiling.facts."""
    log = entry.get("log") or {}
    build, prof = log.get("build_metadata") or {}, log.get("profile_metadata") or {}
    config = entry.get("run_config") or {}
    profile = entry.get("profile")
    return {"tensorrt_version": build.get("tensorrt_version") or prof.get("tensorrt_version"),
            "device": (build.get("device_information") or prof.get("device_information")
                       or {}).get("Selected Device"),
            "status": log.get("status"), "command": build.get("command")
            or config.get("command_line") or config.get("path"),
            "engine": entry.get("engine_metadata"), "timing": entry.get("summary"),
            "trtexec_summary": prof.get("performance_summary"), "profile": profile,
            "top_layers": profile["per_layer"] if profile else None,
            "layer_info": entry.get("layer_info"), "build": build.get("build"),
            "warnings": log.get("warnings")}


def render_text(parsed: dict[str, Any]) -> str:
    blocks = ["\n".join([f"{entry['path']}  [{entry['kind']}]",
                         *to_text(facts(entry_run(entry)))]) for entry in parsed["files"]]
    return "\n\n".join(blocks) + "\n"
