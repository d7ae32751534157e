"""Per-iteration timings from `trtexec --exportTimes` (TensorRT 7-11) and their summary
(docs/trtexec.md, "What each parser reads"); timestamps are ms since trtexec started."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.errors import UserError
from stgcnd_tools.profiling.detect import read_artefact
from stgcnd_tools.stats import TRTEXEC_KEYS, distribution

# Series in the order they appear in tables and CSVs; values are TimingRecord attributes.
SERIES = ("gpu_compute_ms", "latency_ms", "enqueue_ms", "h2d_ms", "d2h_ms")
SERIES_LABELS = {
    "gpu_compute_ms": "GPU compute",
    "latency_ms": "Latency (H2D+compute+D2H)",
    "enqueue_ms": "Enqueue",
    "h2d_ms": "H2D copy",
    "d2h_ms": "D2H copy",
}
REPORT_PERCENTILES = (*range(0, 100), 99.5, 99.9, 100)


@dataclass(frozen=True)
class TimingRecord:
    """One timed inference; durations in ms, `None` where this TensorRT version has no field."""

    start_ms: float
    end_ms: float
    enqueue_ms: float | None
    h2d_ms: float | None
    gpu_compute_ms: float
    d2h_ms: float | None
    latency_ms: float


def _first(raw: Mapping[str, Any], *keys: str) -> float | None:
    for key in keys:
        if key in raw and raw[key] is not None:
            return float(raw[key])
    return None


def record_from_json(raw: Mapping[str, Any]) -> TimingRecord:
    """Normalise one exportTimes object of any supported TensorRT version."""
    compute = _first(raw, "computeMs")
    if compute is None:
        raise ValueError(f"timing record without computeMs: {sorted(raw)}")
    h2d = _first(raw, "h2dMs", "inMs")
    d2h = _first(raw, "d2hMs", "outMs")
    latency = _first(raw, "latencyMs")
    if latency is None:
        latency = compute + (h2d or 0.0) + (d2h or 0.0)
    start_enq, end_enq = _first(raw, "startEnqMs"), _first(raw, "endEnqMs")
    enqueue = end_enq - start_enq if start_enq is not None and end_enq is not None else None
    starts = [v for v in (start_enq, _first(raw, "startH2dMs", "startInMs"),
                          _first(raw, "startComputeMs")) if v is not None]
    ends = [v for v in (_first(raw, "endD2hMs", "endOutMs"), _first(raw, "endComputeMs"),
                        end_enq) if v is not None]
    start = min(starts) if starts else 0.0
    end = max(ends) if ends else start + latency
    return TimingRecord(start_ms=start, end_ms=end, enqueue_ms=enqueue, h2d_ms=h2d,
                        gpu_compute_ms=compute, d2h_ms=d2h, latency_ms=latency)


def parse_times(data: Any) -> list[TimingRecord]:
    if not isinstance(data, list):
        raise ValueError("exportTimes JSON must be an array of per-iteration objects")
    return [record_from_json(item) for item in data if isinstance(item, dict)]


def load_times(path: str | Path) -> list[TimingRecord]:
    return read_artefact(path, lambda text: parse_times(json.loads(text)), "trtexec timings",
                         "exportTimes")


def series(records: Sequence[TimingRecord], name: str) -> np.ndarray:
    """One column (a SERIES name) as float64, records without that field left out."""
    return np.asarray([getattr(r, name) for r in records if getattr(r, name) is not None],
                      dtype=np.float64)


def _jitter(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    diffs = np.abs(np.diff(values)) if values.size > 1 else np.zeros(1)
    return {
        "p99_minus_median": float(np.percentile(values, 99) - np.percentile(values, 50)),
        "max_minus_min": float(values.max() - values.min()),
        "mean_abs_successive_diff": float(diffs.mean()),
    }


def summarize_times(records: Iterable[TimingRecord], batch: int = 1) -> dict[str, Any]:
    """Summary of per-iteration timings; `batch` = windows per inference, for windows/s."""
    recs = list(records)
    if not recs:
        raise UserError("the trtexec timing file has no records; run trtexec with more "
                        "--iterations or a longer --duration")
    if batch < 1:
        raise UserError(f"batch must be >= 1, got {batch}")
    out: dict[str, Any] = {"iterations": len(recs), "batch": batch}
    for name in SERIES:
        values = series(recs, name)
        if values.size:
            out[name] = distribution(values, TRTEXEC_KEYS)
    walltime_ms = max(r.end_ms for r in recs) - min(r.start_ms for r in recs)
    qps = len(recs) / (walltime_ms / 1000.0) if walltime_ms > 0 else None
    mean_compute = out["gpu_compute_ms"]["mean"]
    out["throughput"] = {
        "walltime_s": walltime_ms / 1000.0,
        "qps": qps,
        "windows_per_s": qps * batch if qps is not None else None,
        "gpu_bound_qps": 1000.0 / mean_compute if mean_compute > 0 else None,
        "gpu_bound_windows_per_s": 1000.0 * batch / mean_compute if mean_compute > 0 else None,
    }
    out["jitter_ms"] = {
        "gpu_compute": _jitter(series(recs, "gpu_compute_ms")),
        "latency": _jitter(series(recs, "latency_ms")),
    }
    return out


def _write_csv(path: Path, head: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(head)
        writer.writerows(rows)


def write_times_outputs(records: Sequence[TimingRecord], out_dir: str | Path,
                        batch: int = 1) -> dict[str, Path]:
    """Write summary.json, summary.csv, latency_series.csv and latency_percentiles.csv."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize_times(records, batch)
    paths = {name: out / name for name in ("summary.json", "summary.csv",
                                           "latency_series.csv", "latency_percentiles.csv")}
    paths["summary.json"].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _write_csv(paths["summary.csv"], ["metric", *TRTEXEC_KEYS],
               [[name, *(summary[name][k] for k in TRTEXEC_KEYS)] for name in SERIES
                if name in summary])
    t0 = min(r.start_ms for r in records)
    _write_csv(paths["latency_series.csv"], ["iteration", "start_ms", *SERIES],
               [[i, rec.start_ms - t0, *("" if getattr(rec, name) is None else
                                         getattr(rec, name) for name in SERIES)]
                for i, rec in enumerate(records)])
    qs = [float(q) for q in REPORT_PERCENTILES]  # the percentile curve's points
    _write_csv(paths["latency_percentiles.csv"], ["percentile", "gpu_compute_ms", "latency_ms"],
               zip(qs, *(np.percentile(series(records, name), qs).tolist()
                         for name in ("gpu_compute_ms", "latency_ms"))))
    return paths
