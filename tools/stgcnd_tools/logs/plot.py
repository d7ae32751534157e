"""Latency percentiles over time with the machine's state beside them (matplotlib, headless).

Top panel: p50 (solid) and p99 (dashed) per camera and model, with CPU % (always) and GPU load
and temperature (where the log has them) on the right axis. Bottom panel, only where the log
has them: GPU frequency and board power, where clock drops and throttling show up. Series
without data are left out, legend included; the legend sits outside the data. The action
events and feed states are the operator's figure of their own (logs/timeline.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stgcnd.errors import UserError
from stgcnd_tools.logs.summarize import LogScan, gpu_temp
from stgcnd_tools.stats import number

# The streams' colours: matplotlib's tab10 and its light tones, without those the machine's
# series use (black CPU, gray GPU load, red temperature, blue clock, orange power).
STREAM_COLOURS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
                  "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")


def _series(events: list[dict[str, Any]], key: str) -> tuple[list[Any], list[float]]:
    timed = [(e["_t"], number(e.get(key))) for e in events if "_t" in e]
    return [t for t, v in timed if v is not None], [float(v) for _, v in timed if v is not None]


def plot(log: LogScan, out_path: str | Path, title: str | None = None) -> Path:
    return save(figure(log, title), out_path, "--plot")


def save(fig: Any, out_path: str | Path, option: str) -> Path:
    """`fig` written to `out_path` and closed; a path that cannot be written is the user's
    error, naming the `option` that gave it."""
    import matplotlib.pyplot as plt

    out = Path(out_path)
    try:
        fig.savefig(out, dpi=110)
    except OSError as exc:
        raise UserError(f"cannot write the plot to {out}: {exc.strerror or exc}; "
                        f"choose a writable path for {option}") from None
    finally:
        plt.close(fig)
    return out


def figure(log: LogScan, title: str | None = None) -> Any:
    """The matplotlib Figure of `log` (headless backend)."""
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
    for e in system:
        e["gpu_temp_c"] = gpu_temp(e)

    clock = [k for k in ("gpu_freq_mhz", "power_total_mw") if _series(system, k)[0]]
    ratios = [3.0] + ([1.4] if clock else [])
    fig, axes = plt.subplots(len(ratios), 1, figsize=(14, 3.5 + 2.0 * len(ratios)),
                             sharex=True, squeeze=False, gridspec_kw={"height_ratios": ratios})
    ax_lat = axes[0][0]
    streams: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in latency:
        streams.setdefault((str(e.get("camera")), str(e.get("model"))), []).append(e)
    for i, ((camera, model), events) in enumerate(sorted(streams.items())):
        color = STREAM_COLOURS[i % len(STREAM_COLOURS)]
        label = f"{camera} / {model}"
        for key, style, name in (("p50_ms", "-", "p50"), ("p99_ms", "--", "p99")):
            xs, ys = _series(events, key)
            if xs:
                ax_lat.plot(xs, ys, color=color, lw=1.6 if key == "p50_ms" else 1.2, ls=style,
                            marker="o" if key == "p50_ms" else None, ms=2.5,
                            label=f"{label} {name}")
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_ylim(bottom=0)
    ax_lat.grid(True, alpha=0.3)

    # The machine beside it: CPU % always, the GPU's series where the log has them.
    ax_load = ax_lat.twinx()
    xs, ys = _series(system, "gpu_load_pct")
    if xs:
        ax_load.fill_between(xs, ys, step="mid", color="tab:gray", alpha=0.18,
                             label="GPU load %")
    xs, ys = _series(system, "cpu_pct")
    ax_load.plot(xs, ys, color="black", lw=1.0, alpha=0.7, label="CPU %")
    xs, ys = _series(system, "gpu_temp_c")
    if xs:
        ax_load.plot(xs, ys, color="tab:red", lw=1.3, label="GPU temp °C")
    ax_load.set_ylabel("load (%)" + (" / GPU temperature (°C)" if xs else ""))
    ax_load.set_ylim(0, 105)
    # Draw the latency lines above the load shading, not under it.
    ax_lat.set_zorder(ax_load.get_zorder() + 1)
    ax_lat.patch.set_visible(False)

    if clock:
        ax_clk = axes[1][0]
        xs, ys = _series(system, "gpu_freq_mhz")
        if xs:
            ax_clk.step(xs, ys, where="mid", color="tab:blue", lw=1.3, label="GPU MHz")
            ax_clk.set_ylabel("GPU clock (MHz)")
        ax_clk.set_ylim(bottom=0)
        ax_clk.grid(True, alpha=0.3)
        xs, ys = _series(system, "power_total_mw")
        if xs:
            ax_pow = ax_clk.twinx()
            ax_pow.plot(xs, [y / 1000 for y in ys], color="tab:orange", lw=1.3,
                        label="power W")
            ax_pow.set_ylabel("power (W)")
            ax_pow.set_ylim(bottom=0)


    # One legend, outside the data (it hid the p99 peaks inside).
    pairs = [ax.get_legend_handles_labels() for ax in fig.axes]
    handles, labels = [h for hs, _ in pairs for h in hs], [x for _, xs in pairs for x in xs]
    if handles:
        fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(0.80, 0.97), fontsize=8,
                   framealpha=0.9)
    bottom = axes[-1][0]
    bottom.xaxis.set_major_locator(mdates.AutoDateLocator())
    bottom.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    bottom.set_xlabel("time (UTC, hours:minutes:seconds)")
    ax_lat.set_title(title or "stgcnd latency and machine state")
    fig.tight_layout(rect=(0, 0, 0.79, 1))
    return fig
