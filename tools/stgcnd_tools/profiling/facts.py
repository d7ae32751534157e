"""One trtexec run's facts (report.run_section's keys; parsefile.entry_run for one file) as
parts of (label, value) rows and a table each: `trtexec parse` prints them as text, `trtexec
report` writes them as Markdown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stgcnd_tools.profiling.times import SERIES, SERIES_LABELS
from stgcnd_tools.stats import TRTEXEC_KEYS
from stgcnd_tools.table import markdown, num, table

NO_LAYER_TYPES = ("Layer types unknown: no detailed layer info (export it with "
                  "`--exportLayerInfo` from an engine built with `--profilingVerbosity=detailed`)")


@dataclass
class Part:
    heading: str                                   # '' for the run's own facts
    rows: list[tuple[str, Any]]                    # (label, value); None values are left out
    head: Sequence[str] = ()                       # the table's, if it has one
    table: list[Sequence[Any]] = field(default_factory=list)
    left: int = 1                                  # left-aligned leading columns (text)
    images: Sequence[tuple[str, str]] = ()         # (plot stem, alt text), Markdown only


def _stat_order(key: str) -> tuple[int, float]:
    fixed = ("min", "max", "mean", "median")
    if key in fixed:
        return (0, float(fixed.index(key)))
    try:
        return (1, float(key[1:].replace("_", ".")))  # p90, p99_9
    except ValueError:
        return (2, 0.0)


def _counts(counts: dict[str, int] | None) -> str | None:
    return ", ".join(f"{k} {c}" for k, c in counts.items()) if counts else None


def _short(name: str) -> str:
    # Fused layer names run to hundreds of characters; keep both ends (the JSON has all).
    return name if len(name) <= 100 else f"{name[:48]} … {name[-48:]}"


def facts(run: dict[str, Any], single: bool = True) -> list[Part]:
    """The run's parts, in the order both views show them. `single`: the only run of a
    report (its percentile curve is drawn per run)."""
    engine = run.get("engine") or {}
    size = engine.get("size_bytes")
    parts = [Part("", [
        ("Folder", run.get("dir")), ("TensorRT", run.get("tensorrt_version")),
        ("Device", run.get("device")), ("Status", run.get("status")),
        ("Command", run.get("command")), ("Model file", engine.get("path")),
        ("Size", f"{size / 2**20:.2f} MiB" if size is not None else None),
        ("sha256", f"{engine['sha256'][:16]}…" if engine.get("sha256") else None),
        ("Modified", engine.get("mtime"))])]
    timing = run.get("timing")
    if timing:
        thr = timing["throughput"]
        parts.append(Part("Latency", [
            ("Iterations", timing["iterations"]),
            ("Batch (windows per inference)", timing["batch"]),
            ("Throughput (qps)", thr["qps"]), ("Throughput (windows/s)", thr["windows_per_s"]),
            ("Trace (s)", thr.get("walltime_s")), ("GPU-bound (qps)", thr["gpu_bound_qps"]),
            ("Jitter, GPU compute p99 − median (ms)",
             timing.get("jitter_ms", {}).get("gpu_compute", {}).get("p99_minus_median"))],
            ["ms", *TRTEXEC_KEYS], [[SERIES_LABELS[name], *(timing[name][k]
                                                            for k in TRTEXEC_KEYS)]
                                    for name in SERIES if name in timing],
            images=[("latency_histogram", "latency histogram"),
                    ("latency_series", "latency per iteration")]
            + ([("percentile_curve", "percentile curve")] if single else [])))
    summary = run.get("trtexec_summary")
    if summary:
        metrics = summary.get("metrics_ms") or {}
        keys = sorted({k for m in metrics.values() for k in m}, key=_stat_order)
        parts.append(Part("trtexec's own summary (from its log)",
                          [("Throughput (qps)", summary.get("throughput_qps"))], ["ms", *keys],
                          [[name.replace("_", " "), *(m.get(k) for k in keys)]
                           for name, m in metrics.items()]))
    prof = run.get("profile")
    if prof:
        parts.append(Part("Slowest layers", [
            ("Layers", prof["layers"]), ("Summed average (ms per inference)",
                                         prof["total_average_ms"]),
            ("Profiled iterations", prof["count"] or "?"),
            ("Names", "unescaped in the file; repaired" if prof["repaired_invalid_json"]
             else None),
            ("Medians", None if prof["has_median"] else "none (TensorRT < 8.4)")],
            ["Layer", "Type", "#", "Avg ms", "Median ms", "Share"],
            [[_short(r["name"]), r.get("type", "-"), r["rank"], r["average_ms"],
              r.get("median_ms"), f"{r['share_percent']:.1f}%"]
             for r in run.get("top_layers") or []], left=2,
            images=[("top_layers", "slowest layers")]))
    type_share = run.get("layer_type_share")
    if type_share:
        known = any(r["type"] != "unknown" for r in type_share)
        parts.append(Part("Time by layer type", [("Note", None if known else NO_LAYER_TYPES)],
                          ["Type", "Layers", "Avg ms", "Share"] if known else (),
                          [[r["type"], r["count"], r["average_ms"], f"{r['share_percent']:.1f}%"]
                           for r in type_share] if known else [],
                          images=[("layer_type_share", "time by layer type")]))
    info = run.get("layer_info")
    if info:
        parts.append(Part("Engine layers", [
            ("Layers", info["layers"]), ("Layer info", info["form"].replace("_", " ")),
            ("Schema", info["schema"]), ("Layer types", _counts(info["type_counts"])),
            ("Requested types", _counts(info.get("requested_type_counts"))),
            ("Output precisions", _counts(info["precision_counts"])),
            ("I/O tensors", ", ".join(
                str(t["name"]) + (f" {t['mode']} {t['dtype']} {t.get('dims')}"
                                  if t.get("mode") else "") for t in info["io_tensors"])
             or None)]))
    if run.get("build"):
        parts.append(Part("Build and memory (from the log)", sorted(run["build"].items())))
    if run.get("warnings"):
        parts.append(Part("Warnings in the log", [("Warning", w) for w in run["warnings"][:20]]))
    return parts


def _shown(rows: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in rows if v is not None and v != ""]


def to_text(parts: Sequence[Part], indent: str = "  ") -> list[str]:
    lines: list[str] = []
    for part in parts:
        inner = indent + "  " if part.heading else indent
        if part.heading:
            lines.append(f"{indent}{part.heading}:")
        lines += [f"{inner}{k}: {num(v, none='-')}" for k, v in _shown(part.rows)]
        if part.table:
            lines += table(part.head, [[num(c, none="-") for c in row] for row in part.table],
                           left=part.left, indent=inner)
    return lines


def to_markdown(parts: Sequence[Part], plots: dict[str, str]) -> list[str]:
    """`plots`: the drawn plots, stem -> file name."""
    md: list[str] = []
    for part in parts:
        if part.heading:
            md += [f"### {part.heading}", ""]
        rows = _shown(part.rows)
        md += markdown(["", ""], rows) if rows else []
        md += markdown(part.head, part.table) if part.table else []
        md += [line for stem, alt in part.images for line in image(plots, stem, alt)]
    return md


def image(plots: dict[str, str], stem: str, alt: str) -> list[str]:
    return [f"![{alt}]({plots[stem]})", ""] if stem in plots else []
