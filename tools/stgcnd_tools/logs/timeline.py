"""The operator's timeline (`stgcnd logs plot --events`): what happened on which camera, when.

One row per camera (in natural order: cam2 before cam10), a bar per action event coloured by
its class: faint from `started` (the activity's first window) to the alarm (the start
message's `at`: when the site was told), solid from the alarm to the end, a black tick at the
alarm. An end that was no judgement of the camera's (the daemon stopped, crashed, or failed:
`STOPPED`) is an open red circle; an event open when the log ends, an arrow. Under each row a
thin strip shows the camera's feed states (feed_health lines) in their own colours. Latency
is on the other figure (`--latency`, stgcnd_tools/logs/plot.py).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone, tzinfo
from pathlib import Path
from typing import Any

from stgcnd.errors import UserError
from stgcnd_tools.logs.plot import save
from stgcnd_tools.logs.summarize import LogScan, action_spans

# Ends that say the daemon stopped, not that the activity did: the event may still be going on.
STOPPED = ("shutdown", "daemon-restart", "internal")
# Classes in matplotlib's tab10 order, without the feed strip's colours (red, grey, orange).
CLASS_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                 "#aec7e8", "#98df8a", "#c5b0d5")
FEED_COLOURS = {"silent": "#7f7f7f", "refused": "#000000", "blocked": "#17202a",
                "no-person": "#ffbf00", "low-visibility": "#ff7f0e", "out-of-frame": "#d62728"}
ROW_IN = 0.42      # inches a camera's row takes: 16 cameras read at a glance on a screen


def natural(name: str) -> list[Any]:
    """cam2 before cam10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def plot_events(log: LogScan, out_path: str | Path, title: str | None = None,
                local_time: bool = False) -> Path:
    return save(events_figure(log, title, local_time), out_path, "--events")


def overlap_lanes(spans: list[dict[str, Any]], end_of_log: float) -> tuple[list[int], int]:
    """Each span's lane in its camera's row (the first lane free at its start) and the lanes
    the row needs: one unless events of several classes are open at once."""
    free_at: list[float] = []  # per lane: when its last span ends
    out = []
    for s in spans:
        start = s["started"]
        end = s["ended"] if s["ended"] is not None else end_of_log
        lane = next((i for i, t in enumerate(free_at) if t <= start), len(free_at))
        if lane == len(free_at):
            free_at.append(end)
        free_at[lane] = end
        out.append(lane)
    return out, max(len(free_at), 1)


def events_figure(log: LogScan, title: str | None = None, local_time: bool = False,
                  zone: tzinfo | None = None) -> Any:
    """The matplotlib Figure (headless). `local_time`: the axis in `zone` (default: this
    machine's), else in UTC."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("--events needs matplotlib; install it with "
                        "`pip install 'stgcnd[plots]'`") from None
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    spans = [s for s in action_spans(log) if s["started"] is not None]
    feeds = sorted((e for e in log.feeds if isinstance(e.get("at"), (int, float))),
                   key=lambda e: float(e["at"]))
    if not spans and not feeds:
        raise UserError("nothing to plot: no `action_event` or `feed_health` lines in the "
                        "input (check --camera/--since/--until)")
    zone = (zone or datetime.now().astimezone().tzinfo) if local_time else timezone.utc

    def day(unix: float) -> float:
        return float(mdates.date2num(datetime.fromtimestamp(unix, timezone.utc)))

    times = [t for s in spans for t in (s["started"], s["alarm"], s["ended"]) if t is not None]
    times += [float(e["at"]) for e in feeds]
    times += [e["_t"].timestamp() for e in [*log.latency, *log.system] if "_t" in e]
    end_of_log = max(times)
    cameras = sorted({s["camera"] for s in spans} | {str(e.get("camera")) for e in feeds},
                     key=natural)
    classes = sorted({str(s["class"]) for s in spans})
    colour = {c: CLASS_COLOURS[i % len(CLASS_COLOURS)] for i, c in enumerate(classes)}

    fig, ax = plt.subplots(figsize=(14, 1.8 + ROW_IN * len(cameras)))
    for row, camera in enumerate(cameras):
        own = [s for s in spans if s["camera"] == camera]
        lane_of, lanes = overlap_lanes(own, end_of_log)
        height = 0.6 / lanes  # events open at once on one camera share its row, never hide
        for s, lane in zip(own, lane_of):
            start, alarm = day(s["started"]), day(s["alarm"] or s["started"])
            end = day(s["ended"] if s["ended"] is not None else end_of_log)
            c = colour[str(s["class"])]
            y0 = row - 0.3 + lane * height
            mid = y0 + height / 2
            ax.broken_barh([(start, alarm - start)], (y0, height), color=c, alpha=0.3)
            ax.broken_barh([(alarm, end - alarm)], (y0, height), color=c)
            ax.plot([alarm, alarm], [y0 - 0.08 / lanes, y0 + height + 0.08 / lanes],
                    color="black", lw=1.6)
            if s["ended"] is None:
                ax.plot(end, mid, marker=">", color="black", ms=7)
            elif s["reason"] in STOPPED:
                ax.plot(end, mid, marker="o", mfc="white", mec="tab:red", mew=1.8, ms=7)
        changes = [e for e in feeds if str(e.get("camera")) == camera]
        for e, after in zip(changes, [*changes[1:], None]):
            state = str(e.get("state"))
            if state != "ok":
                x = day(float(e["at"]))
                until = day(float(after["at"])) if after is not None else day(end_of_log)
                ax.broken_barh([(x, until - x)], (row + 0.36, 0.1),
                               color=FEED_COLOURS.get(state, "#7f7f7f"))
    ax.set_ylim(len(cameras) - 0.5, -0.5)  # the first camera on top
    ax.set_yticks(range(len(cameras)))
    ax.set_yticklabels(cameras, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=zone))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=zone))
    first = datetime.fromtimestamp(min(times), zone)
    said = f"local time ({first.strftime('%Z, UTC%z')})" if local_time else "UTC"
    ax.set_xlabel(f"{first.strftime('%Y-%m-%d')}, {said}")
    ax.set_title(title or "stgcnd: action events and feed health per camera")

    states = sorted({str(e.get("state")) for e in feeds} - {"ok"})
    handles: list[Any] = [Patch(color=colour[c], label=c) for c in classes]
    handles += [Line2D([], [], color="black", lw=1.6, label="alarm (start message)"),
                Patch(color="#888888", alpha=0.3, label="before the alarm (debounce)")]
    if any(s["ended"] is not None and s["reason"] in STOPPED for s in spans):
        handles.append(Line2D([], [], ls="", marker="o", mfc="white", mec="tab:red", mew=1.8,
                              label="ended by shutdown/crash"))
    if any(s["ended"] is None for s in spans):
        handles.append(Line2D([], [], ls="", marker=">", color="black",
                              label="open at the log's end"))
    handles += [Patch(color=FEED_COLOURS.get(s, "#7f7f7f"), label=f"feed: {s}")
                for s in states]
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.83, 0.98), fontsize=9,
               framealpha=0.95, title="classes and marks")
    fig.tight_layout(rect=(0, 0, 0.82, 1))
    return fig
