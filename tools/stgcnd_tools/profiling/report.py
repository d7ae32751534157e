"""Reports from trtexec run folders: report.md, report.json and PNG plots.

With several folders, the first is the baseline and every other is compared with it (ratio =
other / baseline).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stgcnd import __version__
from stgcnd.errors import UserError
from stgcnd.log import get_logger
from stgcnd_tools.profiling import plots
from stgcnd_tools.profiling.detect import find_artefacts
from stgcnd_tools.profiling.layerinfo import LayerInfo, load_layer_info
from stgcnd_tools.profiling.logparse import TrtexecLog, load_logish, write_metadata
from stgcnd_tools.profiling.profile import LayerProfile, load_profile
from stgcnd_tools.profiling.times import (
    SERIES,
    SERIES_LABELS,
    TimingRecord,
    load_times,
    summarize_times,
    write_times_outputs,
)
from stgcnd_tools.stats import TRTEXEC_KEYS
from stgcnd_tools.table import markdown

log = get_logger(__name__)

PERCENTILE_NOTE = ("Percentiles: numpy linear interpolation over the exported per-iteration "
                   "records; trtexec's own log summary picks single records, so its p99 can "
                   "differ slightly.")
# Metrics compared across runs: (key, label, where it comes from).
_HEADLINE = (
    ("gpu_compute_median_ms", "GPU compute median (ms)"),
    ("gpu_compute_mean_ms", "GPU compute mean (ms)"),
    ("gpu_compute_p99_ms", "GPU compute p99 (ms)"),
    ("latency_median_ms", "Latency median (ms)"),
    ("latency_p99_ms", "Latency p99 (ms)"),
    ("throughput_qps", "Throughput (qps)"),
    ("windows_per_s", "Throughput (windows/s)"),
    ("layer_time_total_ms", "Summed layer time (ms)"),
    ("layers", "Engine layers"),
    ("engine_size_mib", "Engine size (MiB)"),
)


@dataclass
class RunData:
    name: str
    path: Path
    sources: dict[str, Path]
    times: list[TimingRecord] | None = None
    profile: LayerProfile | None = None
    layer_info: LayerInfo | None = None
    log: TrtexecLog | None = None
    run_config: dict[str, Any] | None = None
    engine_metadata: dict[str, Any] | None = None


@dataclass
class ReportResult:
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)


def load_run(path: str | Path, name: str | None = None) -> RunData:
    path = Path(path)
    sources = find_artefacts(path)
    if not any(k in sources for k in ("times", "profile", "layer_info", "log",
                                      "trex_profile_metadata")):
        raise UserError(f"{path} holds no trtexec artefacts (times/profile/layer info JSON or a "
                        "trtexec log); run `stgcnd trtexec run --out DIR` first")
    run = RunData(name=name or path.resolve().name, path=path, sources=sources)
    if "times" in sources:
        run.times = load_times(sources["times"])
    if "profile" in sources:
        run.profile = load_profile(sources["profile"])
    if "layer_info" in sources:
        run.layer_info = load_layer_info(sources["layer_info"])
    trex = [sources[k] for k in ("trex_build_metadata", "trex_profile_metadata") if k in sources]
    if "log" in sources or trex:
        run.log = load_logish([sources["log"]] if "log" in sources else trex, "log" in sources)
    for kind, attr in (("run_config", "run_config"), ("engine_metadata", "engine_metadata")):
        if kind in sources:
            setattr(run, attr, json.loads(sources[kind].read_text(encoding="utf-8")))
    return run


def layer_type_rows(profile: LayerProfile, info: LayerInfo | None) -> list[dict[str, Any]]:
    """Summed average time per layer type, largest first; unmatched layers are "unknown"."""
    types = info.layer_types() if info else {}
    totals: dict[str, list[float]] = {}
    for layer in profile.layers:
        entry = totals.setdefault(types.get(layer.name, "unknown"), [0.0, 0])
        entry[0] += layer.average_ms
        entry[1] += 1
    total = profile.total_average_ms
    rows = [{"type": t, "count": int(c), "average_ms": ms,
             "share_percent": 100.0 * ms / total if total > 0 else 0.0}
            for t, (ms, c) in totals.items()]
    return sorted(rows, key=lambda r: r["average_ms"], reverse=True)


def headline_metrics(run: RunData, summary: dict[str, Any] | None,
                     batch: int = 1) -> dict[str, float | None]:
    """The numbers compared across runs; trtexec's log summary fills in without times.json."""
    out: dict[str, float | None] = {key: None for key, _ in _HEADLINE}
    if summary:
        out.update(gpu_compute_median_ms=summary["gpu_compute_ms"]["median"],
                   gpu_compute_mean_ms=summary["gpu_compute_ms"]["mean"],
                   gpu_compute_p99_ms=summary["gpu_compute_ms"]["p99"],
                   latency_median_ms=summary["latency_ms"]["median"],
                   latency_p99_ms=summary["latency_ms"]["p99"],
                   throughput_qps=summary["throughput"]["qps"],
                   windows_per_s=summary["throughput"]["windows_per_s"])
    elif run.log and run.log.performance:
        metrics = run.log.performance.get("metrics_ms", {})
        compute = metrics.get("gpu_compute_time", {})
        latency = metrics.get("latency", {})
        out.update(gpu_compute_median_ms=compute.get("median"),
                   gpu_compute_mean_ms=compute.get("mean"),
                   gpu_compute_p99_ms=compute.get("p99"),
                   latency_median_ms=latency.get("median"), latency_p99_ms=latency.get("p99"),
                   throughput_qps=run.log.performance.get("throughput_qps"))
        if out["throughput_qps"] is not None:
            out["windows_per_s"] = out["throughput_qps"] * batch
    if run.profile:
        out["layer_time_total_ms"] = run.profile.total_average_ms
        out["layers"] = float(len(run.profile.layers))
    elif run.layer_info:
        out["layers"] = float(len(run.layer_info.layers))
    if run.engine_metadata and run.engine_metadata.get("kind") == "engine":
        out["engine_size_mib"] = run.engine_metadata["size_bytes"] / 2**20
    elif run.log:
        size = run.log.build.get("created_engine_size_mib") or \
            run.log.build.get("loaded_engine_size_mib")
        out["engine_size_mib"] = float(size) if size is not None else None
    return out


def run_section(run: RunData, batch: int, top_k: int) -> dict[str, Any]:
    summary = summarize_times(run.times, batch) if run.times else None
    section: dict[str, Any] = {
        "name": run.name, "dir": str(run.path),
        "sources": {k: p.name for k, p in sorted(run.sources.items())},
        "engine": run.engine_metadata,
        "command": (run.run_config or {}).get("command_line") or (run.log.command
                                                                   if run.log else None),
        "tensorrt_version": run.log.tensorrt_version if run.log else None,
        "device": (run.log.sections.get("device_information", {}).get("Selected Device")
                   if run.log else None),
        "timing": summary,
        "trtexec_summary": run.log.performance if run.log and run.log.performance else None,
        "build": run.log.build if run.log else None,
        "warnings": run.log.warnings if run.log else [],
    }
    if run.profile:
        types = run.layer_info.layer_types() if run.layer_info else {}
        profile = run.profile.to_dict(types)
        section["profile"] = {k: v for k, v in profile.items() if k != "per_layer"}
        section["top_layers"] = profile["per_layer"][:top_k]
        section["layer_type_share"] = layer_type_rows(run.profile, run.layer_info)
    if run.layer_info:
        info = run.layer_info.to_dict()
        section["layer_info"] = {k: v for k, v in info.items() if k != "per_layer"}
    section["headline"] = headline_metrics(run, summary, batch)
    return section


def _ratio(base: float | None, other: float | None) -> float | None:
    if base is None or other is None or base == 0:
        return None
    return other / base


def compare_sections(sections: Sequence[dict[str, Any]]) -> dict[str, Any]:
    base = sections[0]
    comparison: dict[str, Any] = {"baseline": base["name"], "metrics": [], "layer_types": []}
    for key, label in _HEADLINE:
        values = [s["headline"][key] for s in sections]
        if all(v is None for v in values):
            continue
        comparison["metrics"].append({
            "metric": key, "label": label, "values": values,
            "ratios": [_ratio(values[0], v) for v in values]})
    type_ms: dict[str, list[float | None]] = {}
    for i, s in enumerate(sections):
        for row in s.get("layer_type_share", []):
            type_ms.setdefault(row["type"], [None] * len(sections))[i] = row["average_ms"]
    for layer_type, values in sorted(type_ms.items(), key=lambda kv: -(kv[1][0] or 0.0)):
        comparison["layer_types"].append({
            "type": layer_type, "average_ms": values,
            "ratios": [_ratio(values[0], v) for v in values]})
    return comparison


def _fmt(value: Any, digits: int = 4) -> str:
    return "–" if value is None else f"{value:.{digits}g}" if isinstance(value, float) \
        else str(value)


def _markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    base = runs[0]
    title = base["name"] if len(runs) == 1 else " vs ".join(r["name"] for r in runs)
    md = [f"# trtexec report: {title}", "",
          f"Generated {report['generated_at']} by stgcnd {__version__}. {PERCENTILE_NOTE}", ""]
    plots = {Path(p).stem: Path(p).name for p in report["plots"]}
    if report.get("plots_skipped"):
        md += [f"> Plots skipped: {report['plots_skipped']}.", ""]
    if len(runs) > 1:
        md += ["## Comparison", "",
               f"Baseline: **{base['name']}**; ratio = run / baseline "
               "(for times, < 1 is faster; for throughput, > 1 is faster).", ""]
        header = ["Metric", *(r["name"] for r in runs),
                  *(f"{r['name']} / {base['name']}" for r in runs[1:])]
        rows = [[m["label"], *m["values"], *(_fmt(x, 3) + "×" if x is not None else None
                                            for x in m["ratios"][1:])]
                for m in report["comparison"]["metrics"]]
        md += markdown(header, rows)
        if "comparison" in plots:
            md += [f"![runs compared]({plots['comparison']})", ""]
        if "percentile_curve" in plots:
            md += [f"![percentile curves]({plots['percentile_curve']})", ""]
        if report["comparison"]["layer_types"]:
            md += ["### Time by layer type (ms per inference)", ""]
            rows = [[t["type"], *t["average_ms"], *(_fmt(x, 3) + "×" if x is not None else None
                                                   for x in t["ratios"][1:])]
                    for t in report["comparison"]["layer_types"]]
            md += markdown(["Layer type", *(r["name"] for r in runs),
                          *(f"{r['name']} / {base['name']}" for r in runs[1:])], rows)
    for i, run in enumerate(runs):
        md += _run_markdown(run, plots if i == 0 else {}, single=len(runs) == 1)
    return "\n".join(md).rstrip() + "\n"


def _middle_cut(text: str, width: int = 100) -> str:
    """Fused layer names run to hundreds of characters; keep both ends (report.json has all)."""
    if len(text) <= width:
        return text
    half = (width - 3) // 2
    return f"{text[:half]} … {text[-half:]}"


def _stat_order(key: str) -> tuple[int, float]:
    fixed = ("min", "max", "mean", "median")
    if key in fixed:
        return (0, float(fixed.index(key)))
    try:
        return (1, float(key[1:].replace("_", ".")))  # p90, p99_9
    except ValueError:
        return (2, 0.0)


def _run_markdown(run: dict[str, Any], plots: dict[str, str], single: bool) -> list[str]:
    md = [f"## Run: {run['name']}", ""]
    facts = [("Folder", run["dir"]), ("TensorRT", run["tensorrt_version"]),
             ("Device", run["device"]), ("Command", f"`{run['command']}`" if run["command"]
                                         else None)]
    if run["engine"]:
        engine = run["engine"]
        facts += [("Model file", engine["path"]),
                  ("Size", f"{engine['size_bytes'] / 2**20:.2f} MiB"),
                  ("sha256", f"`{engine['sha256'][:16]}…`"), ("Modified", engine["mtime"])]
    md += markdown(["", ""], [(k, v) for k, v in facts if v])
    timing = run["timing"]
    if timing:
        thr = timing["throughput"]
        md += ["### Latency", "",
               f"{timing['iterations']} iterations, batch {timing['batch']} window(s) per "
               f"inference. Throughput {_fmt(thr['qps'])} qps = {_fmt(thr['windows_per_s'])} "
               f"windows/s over {_fmt(thr['walltime_s'])} s of trace; GPU-bound "
               f"{_fmt(thr['gpu_bound_qps'])} qps. Jitter (GPU compute p99 − median): "
               f"{_fmt(timing['jitter_ms']['gpu_compute'].get('p99_minus_median'))} ms.", ""]
        rows = [[SERIES_LABELS[name], *(timing[name][k] for k in TRTEXEC_KEYS)]
                for name in SERIES if name in timing]
        md += markdown(["ms", *TRTEXEC_KEYS], rows)
        for stem, alt in (("latency_histogram", "latency histogram"),
                          ("latency_series", "latency per iteration")):
            if stem in plots:
                md += [f"![{alt}]({plots[stem]})", ""]
        if single and "percentile_curve" in plots:
            md += [f"![percentile curve]({plots['percentile_curve']})", ""]
    summary = run["trtexec_summary"]
    if summary:
        md += ["### trtexec's own summary (from its log)", ""]
        if summary.get("throughput_qps") is not None:
            md += [f"Throughput {_fmt(summary['throughput_qps'])} qps.", ""]
        metrics = summary.get("metrics_ms", {})
        keys = sorted({k for m in metrics.values() for k in m}, key=_stat_order)
        md += markdown(["ms", *keys], [[name.replace("_", " "), *(m.get(k) for k in keys)]
                                     for name, m in metrics.items()])
    if run.get("top_layers"):
        prof = run["profile"]
        md += ["### Slowest layers", "",
               f"{prof['layers']} layers, summed average {_fmt(prof['total_average_ms'])} ms "
               f"per inference; profiled iterations: {prof['count'] or '?'}"
               + (" (file had unescaped layer names; repaired)." if
                  prof["repaired_invalid_json"] else "."), ""]
        rows = [[r["rank"], f"`{_middle_cut(r['name'])}`", r["type"], r["average_ms"],
                 r["median_ms"],
                 f"{r['share_percent']:.1f}%"] for r in run["top_layers"]]
        md += markdown(["#", "Layer", "Type", "Avg ms", "Median ms", "Share"], rows)
        if "top_layers" in plots:
            md += [f"![slowest layers]({plots['top_layers']})", ""]
        md += ["### Time by layer type", ""]
        if all(r["type"] == "unknown" for r in run["layer_type_share"]):
            md += ["Layer types unknown: no detailed layer info (export it with "
                   "`--exportLayerInfo` from an engine built with "
                   "`--profilingVerbosity=detailed`).", ""]
        else:
            md += markdown(["Type", "Layers", "Avg ms", "Share"],
                         [[r["type"], r["count"], r["average_ms"],
                           f"{r['share_percent']:.1f}%"] for r in run["layer_type_share"]])
        if "layer_type_share" in plots:
            md += [f"![time by layer type]({plots['layer_type_share']})", ""]
    info = run.get("layer_info")
    if info:
        md += ["### Engine layers", "",
               f"{info['layers']} layers ({info['form'].replace('_', ' ')} layer info, schema "
               f"{info['schema']}).", ""]
        if info["type_counts"]:
            md += ["Layer types: " + ", ".join(f"{t} {c}" for t, c in
                                               info["type_counts"].items()), ""]
        if info["precision_counts"]:
            md += ["Output precisions: " + ", ".join(f"{p} {c}" for p, c in
                                                    info["precision_counts"].items()), ""]
        if info["io_tensors"]:
            md += ["I/O tensors: " + ", ".join(
                f"`{t['name']}`" + (f" {t['mode']} {t['dtype']} {t.get('dims')}"
                                    if t.get("mode") else "") for t in info["io_tensors"]), ""]
    build = run["build"]
    if build:
        md += ["### Build and memory (from the log)", ""]
        md += markdown(["", ""], sorted(build.items()))
    if run["warnings"]:
        md += ["### Warnings in the log", ""] + [f"- {w}" for w in run["warnings"][:20]] + [""]
    return md


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path | None = None, *,
                 batch: int = 1, top_k: int = 15, plots: bool = True) -> ReportResult:
    """Write report.md, report.json, summary/CSV files and PNG plots for the given runs."""
    if not run_dirs:
        raise UserError("give at least one run folder")
    runs = [load_run(d) for d in run_dirs]
    names = [r.name for r in runs]
    for i, run in enumerate(runs):  # same folder names from different parents
        if names.count(run.name) > 1:
            run.name = f"{run.name}#{i + 1}"
    out = Path(out_dir) if out_dir else runs[0].path
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".stgcnd_write_test"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"cannot write the report into {out}: {exc}; pass --out DIR") from None
    sections = [run_section(run, batch, top_k) for run in runs]
    report: dict[str, Any] = {
        "generated_by": f"stgcnd {__version__}",
        "generated_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "percentile_definition": "numpy.percentile, linear interpolation",
        "runs": sections, "plots": [], "plots_skipped": None,
    }
    if len(sections) > 1:
        report["comparison"] = compare_sections(sections)
    result = ReportResult(out_dir=out, report=report)
    if runs[0].times:
        result.files += write_times_outputs(runs[0].times, out, batch).values()
    if runs[0].log:
        result.files += write_metadata(runs[0].log, out)
    report["plots_skipped"] = _draw_plots(runs, sections, out, top_k, report) if plots \
        else "disabled with --no-plots"
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(_markdown(report), encoding="utf-8")
    result.files += [out / "report.md", out / "report.json"] + [out / p for p in report["plots"]]
    log.info("trtexec_report_written", out_dir=str(out), runs=len(runs),
             plots=len(report["plots"]), plots_skipped=report["plots_skipped"])
    return result


def _draw_plots(runs: Sequence[RunData], sections: Sequence[dict[str, Any]], out: Path,
                top_k: int, report: dict[str, Any]) -> str | None:
    """Draw what the data allows; returns why plots were skipped, or None."""

    reason = plots.plots_unavailable_reason()
    if reason:
        log.warning("trtexec_plots_skipped", reason=reason)
        return reason
    base, section = runs[0], sections[0]
    drawn: list[Path] = []
    if base.times:
        drawn.append(plots.latency_histogram(base.times, out / "latency_histogram.png",
                                             base.name))
        drawn.append(plots.latency_series(base.times, out / "latency_series.png", base.name))
    timed = [(r.name, r.times) for r in runs if r.times]
    if timed:
        drawn.append(plots.percentile_curve(timed, out / "percentile_curve.png"))
    if section.get("top_layers"):
        drawn.append(plots.top_layers(section["top_layers"], out / "top_layers.png", base.name,
                                      top_k))
        type_rows = section["layer_type_share"]
        if any(r["type"] != "unknown" for r in type_rows):
            drawn.append(plots.layer_type_share(type_rows, out / "layer_type_share.png",
                                                base.name))
    if len(runs) > 1:
        wanted = ("gpu_compute_median_ms", "gpu_compute_p99_ms", "latency_median_ms",
                  "latency_p99_ms", "layer_time_total_ms")
        metrics = {m["label"].replace(" (ms)", ""): m["values"]
                   for m in report["comparison"]["metrics"] if m["metric"] in wanted}
        if metrics:
            drawn.append(plots.comparison_bars([r.name for r in runs], metrics,
                                               out / "comparison.png"))
    report["plots"] = [p.name for p in drawn]
    return None
