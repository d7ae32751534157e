"""Bench rows as a table (stdout), JSON (a list of row objects) and CSV."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from stgcnd.fsutil import atomic_write_bytes, atomic_write_json

COLUMNS = ("backend", "precision", "device", "persons", "frames", "batch", "sessions",
           "mean_ms", "median_ms", "p90_ms", "p95_ms", "p99_ms", "min_ms", "max_ms",
           "windows_per_s", "speedup", "max_abs_diff", "top1_agreement",
           "p99_worst_session_ms", "h2d_ms", "compute_ms", "d2h_ms",
           "trtexec_gpu_compute_median_ms", "trtexec_gpu_compute_p99_ms", "iterations", "note")


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ("backend", "prec", "M", "B", "N", "median ms", "mean ms", "p99 ms", "windows/s",
            "speedup", "max|diff|")
    lines = [head]
    for r in rows:
        diff = r.get("max_abs_diff")
        lines.append((r["backend"], r["precision"], str(r["persons"]), str(r["batch"]),
                      str(r.get("sessions", 1)), _fmt(r["median_ms"]), _fmt(r["mean_ms"]),
                      _fmt(r["p99_ms"]), _fmt(r["windows_per_s"], 1),
                      "-" if r.get("speedup") is None else f"{r['speedup']:.2f}x",
                      "-" if diff is None else f"{diff:.1e}"))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = []
    for n, row in enumerate(lines):
        out.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
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
