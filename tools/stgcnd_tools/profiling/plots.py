"""PNG plots for trtexec reports (matplotlib, Agg backend: no display needed).

matplotlib is the optional `plots` extra; `plots_unavailable_reason()` says why plots cannot
be drawn, and the report goes on without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd_tools.profiling.times import TimingRecord, series

_DPI = 130
_COLORS = {"gpu_compute_ms": "#2a6fdb", "latency_ms": "#e07b39"}
_PALETTE = ("#2a6fdb", "#e07b39", "#3aa35b", "#c4473f", "#8a63c9", "#8c6d31", "#d45fa8",
            "#6f7b8a", "#1aa3a3", "#b5b233")


def plots_unavailable_reason() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'stgcnd[plots]')"
    return None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _finish(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    _pyplot().close(fig)
    return path


def _shorten(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width // 2 - 2] + " … " + text[-(width // 2 - 1):]


def latency_histogram(records: Sequence[TimingRecord], path: Path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    compute = series(records, "gpu_compute_ms")
    latency = series(records, "latency_ms")
    both = np.concatenate([compute, latency])
    bins = np.linspace(both.min(), both.max(), 60) if both.max() > both.min() else 10
    same = latency.size == compute.size and np.allclose(latency, compute)
    shown = [("GPU compute" + (" (= latency: no H2D/D2H copies)" if same else ""), compute,
              _COLORS["gpu_compute_ms"])]
    if not same:
        shown.append(("Latency (H2D + compute + D2H)", latency, _COLORS["latency_ms"]))
    for label, values, color in shown:
        ax.hist(values, bins=bins, alpha=0.6, color=color, label=label)
    for label, values, color in shown:
        short = label.split(" (")[0]
        for q, style in ((50, "-"), (99, "--")):
            x = float(np.percentile(values, q))
            # Values go in the legend: labels on the lines collide when runs are tight.
            ax.axvline(x, color=color, linestyle=style, linewidth=1.3,
                       label=f"{short} p{q}: {x:.4g} ms")
    ax.set_xlabel("time per inference (ms)")
    ax.set_ylabel("iterations")
    ax.set_title(f"{title}: latency distribution ({len(records)} iterations)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8,
              frameon=False)
    ax.grid(alpha=0.3)
    return _finish(fig, path)


def latency_series(records: Sequence[TimingRecord], path: Path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    x = np.arange(len(records))
    compute = series(records, "gpu_compute_ms")
    latency = series(records, "latency_ms")
    if not (latency.size == compute.size and np.allclose(latency, compute)):
        ax.plot(x[: latency.size], latency, color=_COLORS["latency_ms"], linewidth=0.9,
                label="Latency (H2D + compute + D2H)")
    ax.plot(x[: compute.size], compute, color=_COLORS["gpu_compute_ms"], linewidth=0.9,
            label="GPU compute")
    ax.set_xlabel("iteration")
    ax.set_ylabel("ms")
    ax.set_title(f"{title}: time per iteration")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    return _finish(fig, path)


def percentile_curve(runs: Sequence[tuple[str, Sequence[TimingRecord]]], path: Path) -> Path:
    """GPU compute time against percentile, one line per run; the x axis stretches the tail."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    qs = np.array([*np.arange(0, 90, 1.0), *np.arange(90, 99, 0.25), *np.arange(99, 100.01, 0.05)])
    qs = qs[qs <= 100]
    # x = -log10(1 - q/100): 0 at p0, 1 at p90, 2 at p99, 3 at p99.9.
    def to_x(q: np.ndarray) -> np.ndarray:
        return -np.log10(np.clip(1 - q / 100.0, 1e-3, None))

    for i, (name, records) in enumerate(runs):
        color = _PALETTE[i % len(_PALETTE)]
        compute = series(records, "gpu_compute_ms")
        ax.plot(to_x(qs), np.percentile(compute, qs), color=color, linewidth=1.6,
                label=f"{name}: GPU compute")
        latency = series(records, "latency_ms")
        if not (latency.size == compute.size and np.allclose(latency, compute)):
            ax.plot(to_x(qs), np.percentile(latency, qs), color=color, linewidth=1.2,
                    linestyle="--", label=f"{name}: latency")
    ticks = np.array([0, 50, 90, 95, 99, 99.9])
    ax.set_xticks(to_x(ticks))
    ax.set_xticklabels([f"p{t:g}" for t in ticks])
    ax.set_xlabel("percentile (tail stretched)")
    ax.set_ylabel("ms")
    ax.set_title("Latency percentiles")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    return _finish(fig, path)


def top_layers(rows: Sequence[dict[str, Any]], path: Path, title: str, k: int = 15) -> Path:
    """Horizontal bars of the k slowest layers (rows from LayerProfile.to_dict), colour = type."""
    plt = _pyplot()
    shown = list(rows[:k])[::-1]
    types = sorted({r["type"] or "unknown" for r in shown})
    color_of = {t: _PALETTE[i % len(_PALETTE)] for i, t in enumerate(types)}
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(shown) + 1.6))
    bars = ax.barh([_shorten(r["name"]) for r in shown], [r["average_ms"] for r in shown],
                   color=[color_of[r["type"] or "unknown"] for r in shown])
    for bar, row in zip(bars, shown):
        ax.annotate(f" {row['average_ms']:.3g} ms ({row['share_percent']:.1f}%)",
                    xy=(bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    va="center", fontsize=7)
    ax.set_xlim(0, max(r["average_ms"] for r in shown) * 1.3)
    ax.set_xlabel("average time per inference (ms)")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(f"{title}: {len(shown)} slowest layers")
    if any(t != "unknown" for t in types):
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=color_of[t], label=t) for t in types], fontsize=7,
                  loc="lower right", title="layer type", title_fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    return _finish(fig, path)


def layer_type_share(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Share of summed layer time per layer type (rows: type, count, average_ms, share)."""
    plt = _pyplot()
    shown = list(rows)[::-1]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(shown) + 1.6))
    bars = ax.barh([f"{r['type']} ({r['count']})" for r in shown],
                   [r["share_percent"] for r in shown], color=_PALETTE[0])
    for bar, row in zip(bars, shown):
        ax.annotate(f" {row['share_percent']:.1f}% ({row['average_ms']:.3g} ms)",
                    xy=(bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    va="center", fontsize=8)
    top = max(r["share_percent"] for r in shown)
    ax.set_xlim(0, top * 1.3)
    # Room for the labels without ticks past 100 %.
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= min(100.0, top * 1.3)])
    ax.set_xlabel("share of summed layer time (%)")
    ax.set_title(f"{title}: time by layer type (layer count in brackets)")
    ax.grid(axis="x", alpha=0.3)
    return _finish(fig, path)


def comparison_bars(names: Sequence[str], metrics: dict[str, Sequence[float | None]],
                    path: Path) -> Path:
    """Grouped bars: one group per metric (ms), one bar per run."""
    plt = _pyplot()
    labels = list(metrics)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(labels) + 2), 4.5))
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(labels))
    for i, name in enumerate(names):
        values = [metrics[m][i] for m in labels]
        heights = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(x + (i - (len(names) - 1) / 2) * width, heights, width,
                      label=name, color=_PALETTE[i % len(_PALETTE)])
        for bar, value in zip(bars, values):
            if value is not None:
                ax.annotate(f"{value:.3g}", xy=(bar.get_x() + bar.get_width() / 2,
                                                bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("ms")
    ax.set_title(f"Runs compared (baseline: {names[0]})")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _finish(fig, path)
