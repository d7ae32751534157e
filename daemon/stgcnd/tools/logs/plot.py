"""Latency percentiles over time with the GPU's state beside them (matplotlib, headless).

Top panel: p50 (solid) and p99 (dashed) per camera and model, with GPU load and temperature on
the right axis. Bottom panel: GPU frequency and board power, where clock drops and throttling
show up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stgcnd.errors import UserError
from stgcnd.tools.logs.summarize import LogScan


def _series(events: list[dict[str, Any]], key: str) -> tuple[list[Any], list[float]]:
    xs, ys = [], []
    for e in events:
        value = e.get(key)
        if "_t" in e and isinstance(value, (int, float)) and not isinstance(value, bool):
            xs.append(e["_t"])
            ys.append(float(value))
    return xs, ys


def plot(log: LogScan, out_path: str | Path, title: str | None = None) -> Path:
    try:
        import matplotlib
    except ImportError:
        raise UserError("--plot needs matplotlib; install it with "
                        "`pip install 'stgcnd[plots]'`") from None
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    latency = sorted((e for e in log.latency if "_t" in e), key=lambda e: e["_t"])
    system = sorted((e for e in log.system if "_t" in e), key=lambda e: e["_t"])
    if not latency and not system:
        raise UserError("nothing to plot: no timestamped `latency` or `system` events in the "
                        "input (check --camera/--since/--until)")
    for e in system:  # Orin hides the GPU sensor while it is power-gated: use the hottest.
        if e.get("gpu_temp_c") is None:
            e["gpu_temp_c"] = e.get("temp_max_c")

    fig, (ax_lat, ax_clk) = plt.subplots(
        2, 1, figsize=(13, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    streams: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in latency:
        streams.setdefault((str(e.get("camera")), str(e.get("model"))), []).append(e)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((camera, model), events) in enumerate(sorted(streams.items())):
        color = colors[i % len(colors)]
        label = f"{camera} / {model}"
        xs, ys = _series(events, "p50_ms")
        ax_lat.plot(xs, ys, color=color, lw=1.6, marker="o", ms=2.5, label=f"{label} p50")
        xs, ys = _series(events, "p99_ms")
        ax_lat.plot(xs, ys, color=color, lw=1.2, ls="--", label=f"{label} p99")
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_ylim(bottom=0)
    ax_lat.grid(True, alpha=0.3)

    ax_gpu = ax_lat.twinx()
    xs, ys = _series(system, "gpu_load_pct")
    ax_gpu.fill_between(xs, ys, step="mid", color="tab:gray", alpha=0.18, label="GPU load %")
    xs, ys = _series(system, "gpu_temp_c")
    ax_gpu.plot(xs, ys, color="tab:red", lw=1.3, label="GPU temp °C")
    ax_gpu.set_ylabel("GPU load (%) / temperature (°C)")
    ax_gpu.set_ylim(0, 105)
    # Draw the latency lines above the GPU-load shading, not under it.
    ax_lat.set_zorder(ax_gpu.get_zorder() + 1)
    ax_lat.patch.set_visible(False)

    handles, labels = [], []
    for ax in (ax_lat, ax_gpu):
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:
        ax_lat.legend(handles, labels, loc="upper left", fontsize=8, ncol=2, framealpha=0.85)

    xs, ys = _series(system, "gpu_freq_mhz")
    ax_clk.step(xs, ys, where="mid", color="tab:blue", lw=1.3, label="GPU MHz")
    ax_clk.set_ylabel("GPU clock (MHz)")
    ax_clk.set_ylim(bottom=0)
    ax_clk.grid(True, alpha=0.3)
    ax_pow = ax_clk.twinx()
    xs, ys = _series(system, "power_total_mw")
    ax_pow.plot(xs, [y / 1000 for y in ys], color="tab:orange", lw=1.3, label="power W")
    ax_pow.set_ylabel("power (W)")
    ax_pow.set_ylim(bottom=0)
    h1, l1 = ax_clk.get_legend_handles_labels()
    h2, l2 = ax_pow.get_legend_handles_labels()
    if h1 or h2:
        ax_clk.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8, framealpha=0.85)

    locator = mdates.AutoDateLocator()
    ax_clk.xaxis.set_major_locator(locator)
    ax_clk.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax_clk.set_xlabel("time (UTC)")
    ax_lat.set_title(title or "stgcnd latency and GPU state")
    fig.tight_layout()
    out = Path(out_path)
    try:
        fig.savefig(out, dpi=110)
    except OSError as exc:
        raise UserError(f"cannot write the plot to {out}: {exc.strerror or exc}; "
                        "choose a writable path for --plot") from None
    finally:
        plt.close(fig)
    return out
