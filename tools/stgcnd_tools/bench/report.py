"""Bench rows as a table (stdout), JSON (a list of row objects) and CSV."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

from stgcnd.fsutil import atomic_write_bytes, atomic_write_json
from stgcnd_tools.table import cell, table

COLUMNS = ("backend", "precision", "device", "persons", "frames", "batch", "sessions",
           "mean_ms", "median_ms", "p90_ms", "p95_ms", "p99_ms", "min_ms", "max_ms",
           "windows_per_s", "speedup", "speedup_min", "gflops", "peak_share", "load_avg",
           "max_abs_diff", "top1_agreement", "margin_change_median", "margin_change_max",
           "p99_worst_session_ms", "h2d_ms", "compute_ms", "d2h_ms",
           "trtexec_gpu_compute_median_ms", "trtexec_gpu_compute_p99_ms", "iterations", "note")


def _margin(r: dict[str, Any]) -> str:
    if r.get("margin_change_max") is None:
        return "-"
    return f"{r['margin_change_median']:.2g} / {r['margin_change_max']:.2g}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Speedups by the median and by the minimum (the machine's best: on a shared machine the
    fairer of the two); GFLOP/s and the share of the peak where known."""
    head = ("backend", "prec", "M", "B", "N", "min ms", "median ms", "p99 ms", "windows/s",
            "speedup (min)", "speedup (median)", "GFLOP/s", "of peak", "max|diff|",
            "margin change med/max")
    rows_out = []
    for r in rows:
        diff, share = r.get("max_abs_diff"), r.get("peak_share")
        rows_out.append((r["backend"], r["precision"], r["persons"], r["batch"],
                         r.get("sessions", 1), cell(r["min_ms"], 2), cell(r["median_ms"], 2),
                         cell(r["p99_ms"], 2), r["windows_per_s"],
                         "-" if r.get("speedup_min") is None else f"{r['speedup_min']:.2f}x",
                         "-" if r.get("speedup") is None else f"{r['speedup']:.2f}x",
                         cell(r.get("gflops"), 0),
                         "-" if share is None else f"{100 * share:.1f} %",
                         "-" if diff is None else f"{diff:.1e}", _margin(r)))
    out = table(head, rows_out, left=2)
    loads = [r["load_avg"] for r in rows if r.get("load_avg") is not None]
    if loads:
        out.append(f"load average (1 min) while timing: {min(loads):.2f}-{max(loads):.2f} on "
                   f"{os.cpu_count()} CPUs; round-robin rounds, ratios within one run")
    return "\n".join(out)


def write_json(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_json(path, [{k: r.get(k) for k in COLUMNS} for r in rows])


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else r.get(k) for k in COLUMNS})
    atomic_write_bytes(path, buf.getvalue().encode())
