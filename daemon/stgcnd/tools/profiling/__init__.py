"""trtexec profiling toolkit: run trtexec, parse its artefacts, write reports.

Parsers read TensorRT 8.2-11.x artefacts (and TensorRT 7 timing files) without edits; see
docs/trtexec.md. Small API for other commands (e.g. `stgcnd bench --trtexec`):

    from stgcnd.tools.profiling import find_trtexec, run_trtexec, RunOptions, load_times, \
        summarize_times

    trtexec = find_trtexec()                  # Path | None (PATH, /usr/src/tensorrt/bin/...)
    result = run_trtexec(RunOptions(engine=Path("x.engine")), "runs/x")   # RunResult
    summary = summarize_times(load_times(result.artefacts["times"]), batch=1)
    summary["gpu_compute_ms"]["p99"], summary["latency_ms"]["median"], summary["throughput"]["qps"]

Modules: locate (find trtexec), runner (command line, run, run_config/engine_metadata),
times (--exportTimes), profile (--exportProfile), layerinfo (--exportLayerInfo), logparse
(console logs), detect (file kind from content), report (report.md/json), plots (PNGs).
"""

from __future__ import annotations

from stgcnd.tools.profiling.detect import detect_kind, find_artefacts
from stgcnd.tools.profiling.layerinfo import LayerInfo, load_layer_info
from stgcnd.tools.profiling.locate import find_trtexec, require_trtexec
from stgcnd.tools.profiling.logparse import TrtexecLog, load_log, parse_log
from stgcnd.tools.profiling.profile import LayerProfile, load_profile
from stgcnd.tools.profiling.runner import (
    RunOptions,
    RunResult,
    TrtexecFailed,
    build_command,
    run_trtexec,
)
from stgcnd.tools.profiling.times import TimingRecord, load_times, summarize_times

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
