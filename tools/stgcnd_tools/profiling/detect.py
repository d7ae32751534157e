"""Recognise a trtexec artefact from its content, whatever its file name: `detect_kind(path)`
("times", "profile", "layer_info", "log", TREx metadata, "run_config", "engine_metadata",
"unknown") and `find_artefacts(run_dir)` (one file per kind).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from stgcnd.errors import UserError

# Preferred file names (what `stgcnd trtexec run` writes) when a folder holds several candidates.
CANONICAL_NAMES = {
    "times": "times.json", "profile": "profile.json", "layer_info": "layers.json",
    "log": "trtexec.log", "run_config": "run_config.json",
    "engine_metadata": "engine_metadata.json",
}
_HEAD_BYTES = 64 * 1024
_TIMES_KEYS = re.compile(r'"(startEnqMs|startComputeMs|computeMs|latencyMs|startInMs)"')
_FIRST_KEY = re.compile(r'^\[\s*\{\s*"(count|name)"\s*:')
# trtexec's JSON exports are arrays of objects. A log pasted from a terminal also starts with
# "[" ("[03/11/2022-14:57:03] [I] ..." or "[I] ..."), so "[" alone does not make a JSON file.
_JSON_ARRAY_START = re.compile(r"^\[\s*(\{|\]|$)")
# Anchored at line starts so that a document quoting these markers is not taken for a log.
_LOG_MARKERS = re.compile(r"^&&&& (RUNNING|PASSED|FAILED) TensorRT\.trtexec|"
                          r"^(\[[IWEV]\] )?=== (Model Options|Build Options|Inference Options|"
                          r"Performance summary) ===\s*$|"
                          r"^\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\] \[[IWEV]\] ", re.MULTILINE)
# Files a report never reads; skipping them keeps folder scans quiet.
_IGNORED_SUFFIXES = {".png", ".md", ".csv", ".engine", ".plan", ".onnx", ".trt"}
_OWN_OUTPUTS = {"report.json", "summary.json", "build.metadata.json", "profile.metadata.json"}
T = TypeVar("T")


def read_artefact(path: str | Path, parse: Callable[[str], T], what: str, flag: str) -> T:
    """`parse` of the file's text; UserError naming the trtexec flag that writes it if the
    file cannot be read or is not one."""
    try:
        return parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (ValueError, OSError) as exc:
        raise UserError(f"cannot read {what} from {path}: {exc}; pass the file written by "
                        f"`trtexec --{flag}=FILE`") from None


def detect_text(head: str) -> str:
    text = head.lstrip("\ufeff \t\r\n")
    if _JSON_ARRAY_START.match(text):
        first_key = _FIRST_KEY.match(text)
        if first_key and (first_key.group(1) == "count" or '"timeMs"' in text[:4096]):
            return "profile"
        if _TIMES_KEYS.search(text[:4096]):
            return "times"
        return "unknown"
    if text.startswith("{"):
        start = text[:4096]
        if '"Layers"' in start:
            return "layer_info"
        if '"stgcnd_run_config"' in start:
            return "run_config"
        if '"stgcnd_engine_metadata"' in start:
            return "engine_metadata"
        if '"performance_summary"' in start:
            return "trex_profile_metadata"
        if re.search(r'"(build_options|model_options)"', start):
            return "trex_build_metadata"
        return "unknown"
    if _LOG_MARKERS.search(text):
        return "log"
    return "unknown"


def detect_kind(path: str | Path) -> str:
    path = Path(path)
    try:
        with path.open("rb") as fh:
            head = fh.read(_HEAD_BYTES)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if b"\x00" in head[:1024]:
        return "unknown"  # binary, e.g. an engine
    return detect_text(head.decode("utf-8", errors="replace"))


def scan_dir(run_dir: str | Path) -> dict[str, list[Path]]:
    """Every recognised file directly inside `run_dir`, grouped by kind."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a folder; pass the --out folder of "
                        "`stgcnd trtexec run` or a folder of trtexec artefacts")
    found: dict[str, list[Path]] = {}
    for path in sorted(run_dir.iterdir()):
        if not path.is_file() or path.suffix.lower() in _IGNORED_SUFFIXES \
                or path.name in _OWN_OUTPUTS:
            continue
        kind = detect_kind(path)
        if kind != "unknown":
            found.setdefault(kind, []).append(path)
    return found


def find_artefacts(run_dir: str | Path) -> dict[str, Path]:
    """One file per kind in a run folder: the canonical name if present, else the only one."""
    chosen: dict[str, Path] = {}
    for kind, paths in scan_dir(run_dir).items():
        canonical = [p for p in paths if p.name == CANONICAL_NAMES.get(kind)]
        if canonical:
            chosen[kind] = canonical[0]
        elif len(paths) == 1:
            chosen[kind] = paths[0]
        else:
            names = ", ".join(p.name for p in paths)
            raise UserError(f"{run_dir} holds several {kind} files ({names}); keep one trtexec "
                            f"run per folder or name the one to use "
                            f"{CANONICAL_NAMES.get(kind, kind)}")
    return chosen
