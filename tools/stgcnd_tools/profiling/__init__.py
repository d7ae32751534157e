"""trtexec profiling: run trtexec, parse its artefacts (TensorRT 7-11), write reports.

The entry points docs/trtexec.md names are re-exported here.
"""

from __future__ import annotations

from stgcnd_tools.profiling.detect import detect_kind, find_artefacts
from stgcnd_tools.profiling.layerinfo import load_layer_info
from stgcnd_tools.profiling.logparse import load_log
from stgcnd_tools.profiling.profile import load_profile
from stgcnd_tools.profiling.runner import RunOptions, TrtexecFailed, find_trtexec, run_trtexec
from stgcnd_tools.profiling.times import load_times, summarize_times

__all__ = ["RunOptions", "TrtexecFailed", "detect_kind", "find_artefacts", "find_trtexec",
           "load_layer_info", "load_log", "load_profile", "load_times", "run_trtexec",
           "summarize_times"]
