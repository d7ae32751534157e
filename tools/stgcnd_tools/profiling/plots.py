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

_PALETTE = ("#2a6fdb", "#e07b39", "#3aa35b", "#c4473f", "#8a63c9", "#8c6d31", "#d45fa8",
            "#6f7b8a", "#1aa3a3", "#b5b233")
_LATENCY = "Latency (H2D + compute + D2H)"


def plots_unavailable_reason() -> str | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'stgcnd[plots]')"
    return None


def _axes(size: tuple[float, float]) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=size)


def _finish(fig: Any, ax: Any, path: Path, title: str, xlabel: str, ylabel: str = "",
            grid: str = "both") -> Path:
    import matplotlib.pyplot as plt

    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(axis=grid, alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def _compute_latency(records: Sequence[TimingRecord]) -> tuple[np.ndarray, np.ndarray | None]:
    """GPU compute, and latency unless it equals compute (no H2D/D2H copies)."""
    compute, latency = series(records, "gpu_compute_ms"), series(records, "latency_ms")
    same = latency.size == compute.size and np.allclose(latency, compute)
    return compute, None if same else latency


def latency_histogram(records: Sequence[TimingRecord], path: Path, title: str) -> Path:
    fig, ax = _axes((8, 5))
    compute, latency = _compute_latency(records)
    shown = [("GPU compute" + (" (= latency: no H2D/D2H copies)" if latency is None else ""),
              compute, _PALETTE[0])]
    if latency is not None:
        shown.append((_LATENCY, latency, _PALETTE[1]))
    both = np.concatenate([v for _, v, _ in shown])
    bins = np.linspace(both.min(), both.max(), 60) if both.max() > both.min() else 10
    for label, values, color in shown:
        ax.hist(values, bins=bins, alpha=0.6, color=color, label=label)
    for label, values, color in shown:
        for q, style in ((50, "-"), (99, "--")):
            x = float(np.percentile(values, q))
            # Values go in the legend: labels on the lines collide when runs are tight.
            ax.axvline(x, color=color, linestyle=style, linewidth=1.3,
                       label=f"{label.split(' (')[0]} p{q}: {x:.4g} ms")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8,
              frameon=False)
    return _finish(fig, ax, path, f"{title}: latency distribution ({len(records)} iterations)",
                   "time per inference (ms)", "iterations")


def latency_series(records: Sequence[TimingRecord], path: Path, title: str) -> Path:
    fig, ax = _axes((8, 3.8))
    compute, latency = _compute_latency(records)
    if latency is not None:
        ax.plot(latency, color=_PALETTE[1], linewidth=0.9, label=_LATENCY)
    ax.plot(compute, color=_PALETTE[0], linewidth=0.9, label="GPU compute")
    ax.legend(loc="upper right", fontsize=8)
    return _finish(fig, ax, path, f"{title}: time per iteration", "iteration", "ms")


def percentile_curve(runs: Sequence[tuple[str, Sequence[TimingRecord]]], path: Path) -> Path:
    """GPU compute time against percentile, one line per run; the x axis stretches the tail:
    x = -log10(1 - q/100), 0 at p0, 1 at p90, 2 at p99, 3 at p99.9."""
    fig, ax = _axes((8, 4.5))
    qs = np.array([*np.arange(0, 90, 1.0), *np.arange(90, 99, 0.25), *np.arange(99, 100.01, 0.05)])
    qs = qs[qs <= 100]

    def to_x(q: np.ndarray) -> np.ndarray:
        return -np.log10(np.clip(1 - q / 100.0, 1e-3, None))

    for i, (name, records) in enumerate(runs):
        color = _PALETTE[i % len(_PALETTE)]
        compute, latency = _compute_latency(records)
        ax.plot(to_x(qs), np.percentile(compute, qs), color=color, linewidth=1.6,
                label=f"{name}: GPU compute")
        if latency is not None:
            ax.plot(to_x(qs), np.percentile(latency, qs), color=color, linewidth=1.2,
                    linestyle="--", label=f"{name}: latency")
    ticks = np.array([0, 50, 90, 95, 99, 99.9])
    ax.set_xticks(to_x(ticks))
    ax.set_xticklabels([f"p{t:g}" for t in ticks])
    ax.legend(loc="upper left", fontsize=8)
    return _finish(fig, ax, path, "Latency percentiles", "percentile (tail stretched)", "ms")


def _bars(labels: list[str], values: list[float], notes: list[str], colors: Any,
          height: float) -> tuple[Any, Any]:
    """Horizontal bars, the first label at the top, each annotated with its note."""
    fig, ax = _axes((10 if height < 0.4 else 8, height * len(labels) + 1.6))
    bars = ax.barh(labels[::-1], values[::-1], color=colors[::-1] if isinstance(colors, list)
                   else colors)
    for bar, note in zip(bars, notes[::-1]):
        ax.annotate(f" {note}", xy=(bar.get_width(), bar.get_y() + bar.get_height() / 2),
                    va="center", fontsize=7)
    ax.set_xlim(0, max(values) * 1.3)
    return fig, ax


def top_layers(rows: Sequence[dict[str, Any]], path: Path, title: str, k: int = 15) -> Path:
    """Bars of the k slowest layers (rows from LayerProfile.to_dict), colour = layer type."""
    shown = list(rows[:k])
    types = sorted({r["type"] or "unknown" for r in shown})
    color_of = {t: _PALETTE[i % len(_PALETTE)] for i, t in enumerate(types)}
    names = [r["name"] if len(r["name"]) <= 60 else f"{r['name'][:28]} … {r['name'][-29:]}"
             for r in shown]
    fig, ax = _bars(names, [r["average_ms"] for r in shown],
                    [f"{r['average_ms']:.3g} ms ({r['share_percent']:.1f}%)" for r in shown],
                    [color_of[r["type"] or "unknown"] for r in shown], 0.38)
    ax.tick_params(axis="y", labelsize=7)
    if any(t != "unknown" for t in types):
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=color_of[t], label=t) for t in types], fontsize=7,
                  loc="lower right", title="layer type", title_fontsize=7)
    return _finish(fig, ax, path, f"{title}: {len(shown)} slowest layers",
                   "average time per inference (ms)", grid="x")


def layer_type_share(rows: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Share of summed layer time per layer type (rows: type, count, average_ms, share)."""
    shares = [r["share_percent"] for r in rows]
    fig, ax = _bars([f"{r['type']} ({r['count']})" for r in rows], shares,
                    [f"{r['share_percent']:.1f}% ({r['average_ms']:.3g} ms)" for r in rows],
                    _PALETTE[0], 0.4)
    # Room for the labels without ticks past 100 %.
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= min(100.0, max(shares) * 1.3)])
    return _finish(fig, ax, path, f"{title}: time by layer type (layer count in brackets)",
                   "share of summed layer time (%)", grid="x")


def comparison_bars(names: Sequence[str], metrics: dict[str, Sequence[float | None]],
                    path: Path) -> Path:
    """Grouped bars: one group per metric (ms), one bar per run."""
    labels = list(metrics)
    fig, ax = _axes((max(6, 1.6 * len(labels) + 2), 4.5))
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(labels))
    for i, name in enumerate(names):
        values = [metrics[m][i] for m in labels]
        bars = ax.bar(x + (i - (len(names) - 1) / 2) * width, [v or 0.0 for v in values], width,
                      label=name, color=_PALETTE[i % len(_PALETTE)])
        for bar, value in zip(bars, values):
            if value is not None:
                ax.annotate(f"{value:.3g}", xy=(bar.get_x() + bar.get_width() / 2,
                                                bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, fontsize=8)
    ax.legend(fontsize=8)
    return _finish(fig, ax, path, f"Runs compared (baseline: {names[0]})", "", "ms", grid="y")
