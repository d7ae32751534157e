"""trtexec profiling toolkit: run trtexec, parse its artefacts, write reports.

Parsers read TensorRT 8.2-11.x artefacts (and TensorRT 7 timing files) without edits
(docs/trtexec.md). Entry points: find_trtexec, run_trtexec, load_times, summarize_times.
"""

from __future__ import annotations

from stgcnd_tools.profiling.detect import detect_kind, find_artefacts
from stgcnd_tools.profiling.layerinfo import LayerInfo, load_layer_info
from stgcnd_tools.profiling.locate import find_trtexec, require_trtexec
from stgcnd_tools.profiling.logparse import TrtexecLog, load_log, parse_log
from stgcnd_tools.profiling.profile import LayerProfile, load_profile
from stgcnd_tools.profiling.runner import (
    RunOptions,
    RunResult,
    TrtexecFailed,
    build_command,
    run_trtexec,
)
from stgcnd_tools.profiling.times import TimingRecord, load_times, summarize_times

__all__ = [
    "LayerInfo",
    "LayerProfile",
    "RunOptions",
    "RunResult",
    "TimingRecord",
    "TrtexecFailed",
    "TrtexecLog",
    "build_command",
    "detect_kind",
    "find_artefacts",
    "find_trtexec",
    "load_layer_info",
    "load_log",
    "load_profile",
    "load_times",
    "parse_log",
    "require_trtexec",
    "run_trtexec",
    "summarize_times",
]
