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
from stgcnd_tools.profiling.facts import facts, image, to_markdown
from stgcnd_tools.profiling.layerinfo import LayerInfo, load_layer_info
from stgcnd_tools.profiling.logparse import TrtexecLog, load_logish, write_metadata
from stgcnd_tools.profiling.plots import plots_unavailable_reason
from stgcnd_tools.profiling.profile import LayerProfile, load_profile
from stgcnd_tools.profiling.times import (
    TimingRecord,
    load_times,
    summarize_times,
    write_times_outputs,
)
from stgcnd_tools.table import markdown, num

log = get_logger(__name__)

PERCENTILE_NOTE = ("Percentiles: numpy linear interpolation over the exported per-iteration "
                   "records; trtexec's own log summary picks single records, so its p99 can "
                   "differ slightly.")
# Metrics compared across runs: key -> label.
_HEADLINE = {
    "gpu_compute_median_ms": "GPU compute median (ms)", "gpu_compute_mean_ms":
    "GPU compute mean (ms)", "gpu_compute_p99_ms": "GPU compute p99 (ms)",
    "latency_median_ms": "Latency median (ms)", "latency_p99_ms": "Latency p99 (ms)",
    "throughput_qps": "Throughput (qps)", "windows_per_s": "Throughput (windows/s)",
    "layer_time_total_ms": "Summed layer time (ms)", "layers": "Engine layers",
    "engine_size_mib": "Engine size (MiB)"}
# Plotted in comparison.png.
_COMPARED_MS = ("gpu_compute_median_ms", "gpu_compute_p99_ms", "latency_median_ms",
                "latency_p99_ms", "layer_time_total_ms")


@dataclass
class RunData:
    name: str
    path: Path
    sources: dict[str, Path]
    times: list[TimingRecord] | None = None
    profile: LayerProfile | None = None
    layer_info: LayerInfo | None = None
    log: TrtexecLog | None = None
    json: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_config, engine_metadata


@dataclass
class ReportResult:
    out_dir: Path
    files: list[Path] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)


def load_run(path: str | Path) -> RunData:
    path = Path(path)
    sources = find_artefacts(path)
    if not any(k in sources for k in ("times", "profile", "layer_info", "log",
                                      "trex_profile_metadata")):
        raise UserError(f"{path} holds no trtexec artefacts (times/profile/layer info JSON or a "
                        "trtexec log); run `stgcnd trtexec run --out DIR` first")
    run = RunData(name=path.resolve().name, path=path, sources=sources)
    if "times" in sources:
        run.times = load_times(sources["times"])
    if "profile" in sources:
        run.profile = load_profile(sources["profile"])
    if "layer_info" in sources:
        run.layer_info = load_layer_info(sources["layer_info"])
    trex = [sources[k] for k in ("trex_build_metadata", "trex_profile_metadata") if k in sources]
    if "log" in sources or trex:
        run.log = load_logish([sources["log"]] if "log" in sources else trex, "log" in sources)
    run.json = {kind: json.loads(sources[kind].read_text(encoding="utf-8"))
                for kind in ("run_config", "engine_metadata") if kind in sources}
    return run


def layer_type_rows(profile: LayerProfile, info: LayerInfo | None) -> list[dict[str, Any]]:
    """Summed average time per layer type, largest first; unmatched layers are "unknown"."""
    types = info.layer_types() if info else {}
    totals: dict[str, list[float]] = {}
    for layer in profile.layers:
        entry = totals.setdefault(types.get(layer.name, "unknown"), [0.0, 0])
        entry[0] += layer.average_ms
        entry[1] += 1
    rows = [{"type": t, "count": int(c), "average_ms": ms, "share_percent":
             100.0 * ms / profile.total_average_ms if profile.total_average_ms > 0 else 0.0}
            for t, (ms, c) in totals.items()]
    return sorted(rows, key=lambda r: r["average_ms"], reverse=True)


def headline_metrics(run: RunData, summary: dict[str, Any] | None,
                     batch: int = 1) -> dict[str, float | None]:
    """The numbers compared across runs; trtexec's log summary fills in without times.json."""
    out: dict[str, float | None] = dict.fromkeys(_HEADLINE)
    perf = run.log.performance if run.log else {}
    if summary:
        compute, latency = summary["gpu_compute_ms"], summary["latency_ms"]
        out.update(throughput_qps=summary["throughput"]["qps"],
                   windows_per_s=summary["throughput"]["windows_per_s"])
    elif perf:
        compute = perf.get("metrics_ms", {}).get("gpu_compute_time", {})
        latency = perf.get("metrics_ms", {}).get("latency", {})
        qps = out["throughput_qps"] = perf.get("throughput_qps")
        out["windows_per_s"] = qps * batch if qps is not None else None
    else:
        compute = latency = {}
    out.update(gpu_compute_median_ms=compute.get("median"), gpu_compute_mean_ms=compute.get(
        "mean"), gpu_compute_p99_ms=compute.get("p99"), latency_median_ms=latency.get("median"),
        latency_p99_ms=latency.get("p99"))
    if run.profile:
        out["layer_time_total_ms"] = run.profile.total_average_ms
        out["layers"] = float(len(run.profile.layers))
    elif run.layer_info:
        out["layers"] = float(len(run.layer_info.layers))
    engine = run.json.get("engine_metadata") or {}
    if engine.get("kind") == "engine":
        out["engine_size_mib"] = engine["size_bytes"] / 2**20
    elif run.log:
        size = run.log.build.get("created_engine_size_mib") or \
            run.log.build.get("loaded_engine_size_mib")
        out["engine_size_mib"] = float(size) if size is not None else None
    return out


def run_section(run: RunData, batch: int, top_k: int) -> dict[str, Any]:
    summary = summarize_times(run.times, batch) if run.times else None
    lg = run.log
    section: dict[str, Any] = {
        "name": run.name, "dir": str(run.path),
        "sources": {k: p.name for k, p in sorted(run.sources.items())},
        "engine": run.json.get("engine_metadata"),
        "command": (run.json.get("run_config") or {}).get("command_line")
        or (lg.command if lg else None),
        "tensorrt_version": lg.tensorrt_version if lg else None,
        "device": lg.sections.get("device_information", {}).get("Selected Device") if lg
        else None,
        "timing": summary,
        "trtexec_summary": lg.performance if lg and lg.performance else None,
        "build": lg.build if lg else None,
        "warnings": lg.warnings if lg else [],
    }
    if run.profile:
        profile = run.profile.to_dict(run.layer_info.layer_types() if run.layer_info else {})
        section["profile"] = {k: v for k, v in profile.items() if k != "per_layer"}
        section["top_layers"] = profile["per_layer"][:top_k]
        section["layer_type_share"] = layer_type_rows(run.profile, run.layer_info)
    if run.layer_info:
        section["layer_info"] = {k: v for k, v in run.layer_info.to_dict().items()
                                 if k != "per_layer"}
    section["headline"] = headline_metrics(run, summary, batch)
    return section


def _ratios(values: Sequence[float | None]) -> list[float | None]:
    return [None if values[0] is None or v is None or values[0] == 0 else v / values[0]
            for v in values]


def compare_sections(sections: Sequence[dict[str, Any]]) -> dict[str, Any]:
    comparison: dict[str, Any] = {"baseline": sections[0]["name"], "metrics": [],
                                  "layer_types": []}
    for key, label in _HEADLINE.items():
        values = [s["headline"][key] for s in sections]
        if any(v is not None for v in values):
            comparison["metrics"].append({"metric": key, "label": label, "values": values,
                                          "ratios": _ratios(values)})
    type_ms: dict[str, list[float | None]] = {}
    for i, s in enumerate(sections):
        for row in s.get("layer_type_share", []):
            type_ms.setdefault(row["type"], [None] * len(sections))[i] = row["average_ms"]
    for layer_type, values in sorted(type_ms.items(), key=lambda kv: -(kv[1][0] or 0.0)):
        comparison["layer_types"].append({"type": layer_type, "average_ms": values,
                                          "ratios": _ratios(values)})
    return comparison


def _markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    base = runs[0]["name"]
    title = base if len(runs) == 1 else " vs ".join(r["name"] for r in runs)
    md = [f"# trtexec report: {title}", "",
          f"Generated {report['generated_at']} by stgcnd {__version__}. {PERCENTILE_NOTE}", ""]
    plots = {Path(p).stem: Path(p).name for p in report["plots"]}
    if report.get("plots_skipped"):
        md += [f"> Plots skipped: {report['plots_skipped']}.", ""]
    if len(runs) > 1:
        head = [*(r["name"] for r in runs), *(f"{r['name']} / {base}" for r in runs[1:])]

        def rows(items: list[dict[str, Any]], label: str, values: str) -> list[list[Any]]:
            return [[m[label], *m[values], *(None if x is None else num(x, 3) + "×"
                                             for x in m["ratios"][1:])] for m in items]

        cmp = report["comparison"]
        md += ["## Comparison", "", f"Baseline: **{base}**; ratio = run / baseline "
               "(for times, < 1 is faster; for throughput, > 1 is faster).", ""]
        md += markdown(["Metric", *head], rows(cmp["metrics"], "label", "values"))
        md += image(plots, "comparison", "runs compared")
        md += image(plots, "percentile_curve", "percentile curves")
        if cmp["layer_types"]:
            md += ["### Time by layer type (ms per inference)", ""]
            md += markdown(["Layer type", *head], rows(cmp["layer_types"], "type", "average_ms"))
    for i, run in enumerate(runs):
        md += [f"## Run: {run['name']}", "", *to_markdown(facts(run, len(runs) == 1),
                                                           plots if i == 0 else {})]
    return "\n".join(md).rstrip() + "\n"


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
        (out / "report.json").touch()
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
    reason = "disabled with --no-plots" if not plots else plots_unavailable_reason()
    if plots and reason:
        log.warning("trtexec_plots_skipped", reason=reason)
    if reason is None:
        report["plots"] = [p.name for p in _draw_plots(runs, sections, out, top_k, report)]
    report["plots_skipped"] = reason
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(_markdown(report), encoding="utf-8")
    result.files += [out / "report.md", out / "report.json"] + [out / p for p in report["plots"]]
    log.info("trtexec_report_written", out_dir=str(out), runs=len(runs),
             plots=len(report["plots"]), plots_skipped=report["plots_skipped"])
    return result


def _draw_plots(runs: Sequence[RunData], sections: Sequence[dict[str, Any]], out: Path,
                top_k: int, report: dict[str, Any]) -> list[Path]:
    """Draw what the data allows."""
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
    metrics = {m["label"].replace(" (ms)", ""): m["values"]
               for m in report.get("comparison", {}).get("metrics", [])
               if m["metric"] in _COMPARED_MS}
    if metrics:
        drawn.append(plots.comparison_bars([r.name for r in runs], metrics,
                                           out / "comparison.png"))
    return drawn
