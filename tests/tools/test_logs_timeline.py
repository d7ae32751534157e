"""`stgcnd logs plot --events`, the operator's timeline (tools/stgcnd_tools/logs/timeline.py),
on a site's log: 16 cameras, 3 classes, a daemon restart that ends what was open, events open
at the log's end, feed states (issue #42: the strip under the latency figure had one colour,
no key, cut labels, shutdown ends like real ones, bars from `started`, UTC only)."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone

import pytest

from stgcnd_tools.logs.summarize import scan

CLASSES = ["shoplifting", "fall", "fight"]
T0 = 1764079200.0      # 2025-11-25 14:00:00 UTC
RESTART = T0 + 900     # the daemon stops: the events open then end `shutdown`/`daemon-restart`


def site_log(cameras: int = 16) -> list[str]:
    rnd, lines = random.Random(1), []

    def line(at: float, **fields: object) -> None:
        stamp = datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines.append(json.dumps({"timestamp": stamp, "at": at, **fields}))

    for c in range(1, cameras + 1):
        camera = f"aisle-{c}" if c % 4 else f"loading-dock-entrance-{c}"
        t, n = T0 + rnd.uniform(0, 60), 0
        while t < T0 + 1500:
            n += 1
            event = {"event": "action_event", "id": f"{camera}/m/1/{n}", "camera": camera,
                     "model": "m", "class": CLASSES[(c + n) % 3], "started": t, "peak": 0.9}
            alarm = t + rnd.uniform(2, 8)
            end = alarm + rnd.uniform(20, 150)
            line(alarm, kind="start", **event)
            reason = "below-exit"
            if alarm < RESTART < end:
                end, reason = RESTART, "shutdown" if c % 2 else "daemon-restart"
            line(end, kind="end", ended=end, reason=reason, **event)
            t = end + rnd.uniform(30, 200)
        if c % 5 == 0:   # open when the log ends
            line(t + 5, kind="start", **{**event, "id": f"{camera}/m/1/0", "started": t})
            line(T0 + 300, event="feed_health", kind="feed", camera=camera,
                 state="low-visibility", previous="ok")
            line(T0 + 420, event="feed_health", kind="feed", camera=camera, state="ok",
                 previous="low-visibility")
    return lines


def test_sixteen_cameras_and_three_classes_read_at_a_glance(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.dates as mdates

    from stgcnd_tools.logs.timeline import events_figure

    log = scan(site_log())
    fig = events_figure(log)
    ax = fig.axes[0]
    cameras = [t.get_text() for t in ax.get_yticklabels()]
    assert len(cameras) == 16 and cameras[:2] == ["aisle-1", "aisle-2"]
    assert cameras.index("aisle-10") > cameras.index("aisle-9")      # natural order
    # No label cut: every camera name and legend entry lies wholly inside the figure.
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    inside = fig.bbox
    texts = [*ax.get_yticklabels(), *fig.legends[0].get_texts(), ax.xaxis.label]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and \
            box.y1 <= inside.y1, text.get_text()
    # A colour a class, in a legend with the marks.
    legend = fig.legends[0]
    entries = [t.get_text() for t in legend.get_texts()]
    assert entries[:3] == sorted(CLASSES)
    colours = {tuple(h.get_facecolor()) for h in legend.legend_handles[:3]}
    assert len(colours) == 3
    assert {"alarm (start message)", "ended by shutdown/crash", "open at the log's end",
            "feed: low-visibility"} <= set(entries)
    # The alarm mark at each start message's `at`, not at `started`.
    starts = [e for e in log.actions if e["kind"] == "start"]
    ticks = sorted(line.get_xdata()[0] for line in ax.get_lines()
                   if line.get_marker() in ("None", "") and line.get_color() == "black")
    want = sorted(float(mdates.date2num(datetime.fromtimestamp(e["at"], timezone.utc)))
                  for e in starts)
    assert ticks == pytest.approx(want)
    # Ends by a shutdown or a restart marked apart from the real ones.
    stopped = [e for e in log.actions if e.get("reason") in ("shutdown", "daemon-restart")]
    circles = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert stopped and len(circles) == len(stopped)


def test_local_time_moves_the_axis_and_says_its_zone():
    pytest.importorskip("matplotlib")
    import matplotlib.dates as mdates

    from stgcnd_tools.logs.timeline import events_figure

    log = scan(site_log(4))
    at = float(mdates.date2num(datetime.fromtimestamp(T0, timezone.utc)))
    utc = events_figure(log).axes[0]
    assert utc.xaxis.get_major_formatter()(at) == "14:00:00"
    assert utc.get_xlabel() == "2025-11-25, UTC"
    local = events_figure(log, local_time=True,
                          zone=timezone(timedelta(hours=1), "CET")).axes[0]
    assert local.xaxis.get_major_formatter()(at) == "15:00:00"
    assert local.get_xlabel() == "2025-11-25, local time (CET, UTC+0100)"


def test_the_command_writes_the_events_figure(tmp_path, stgcnd_main):
    pytest.importorskip("matplotlib")
    log = tmp_path / "stgcnd.log"
    log.write_text("\n".join(site_log(3)) + "\n")
    out = tmp_path / "events.png"
    result = stgcnd_main("logs", "plot", str(log), "--events", str(out), "--local-time")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    refused = stgcnd_main("logs", "plot", str(log))
    assert refused.returncode != 0 and "--events OUT.png" in refused.stderr
