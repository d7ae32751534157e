"""Turn the daemon's JSON log lines into per-camera latency and system summaries.

Input is `journalctl -u stgcnd -o cat`; other lines are skipped and counted. Percentiles are
exact from `request` events, else combined from the per-interval `latency` events (an
approximation, reported beside the worst interval's p99).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from stgcnd_tools.stats import number
from stgcnd_tools.table import cell, table

SYSTEM_RANGE_FIELDS = ("gpu_load_pct", "gpu_freq_mhz", "gpu_temp_c", "temp_max_c",
                       "power_total_mw", "emc_freq_mhz", "cpu_pct", "ram_used_mb", "rss_mb")
INTERVAL_SYSTEM_FIELDS = ("gpu_load_pct", "gpu_freq_mhz", "gpu_temp_c", "power_total_mw")
SPAN_PERCENTILES = (50, 90, 95, 99)

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """ISO-8601 (naive = UTC) or a relative age such as ``10m``, ``2h``, ``1d``, ``30s``."""
    m = _RELATIVE.match(text)
    if m:
        now = now or datetime.now(timezone.utc)
        return now - timedelta(seconds=float(m.group(1)) * _UNITS_S[m.group(2)])
    value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _event_time(event: dict[str, Any]) -> datetime | None:
    ts = event.get("timestamp")
    if not isinstance(ts, str):
        return None
    try:
        return parse_time(ts) if not _RELATIVE.match(ts) else None
    except ValueError:
        return None


@dataclass
class LogScan:
    """The events of one log, split by kind, after filtering."""

    latency: list[dict[str, Any]] = field(default_factory=list)
    system: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)  # action_event lines
    quality: list[dict[str, Any]] = field(default_factory=list)  # skeleton_quality lines
    feeds: list[dict[str, Any]] = field(default_factory=list)  # feed_health lines
    events: Counter[str] = field(default_factory=Counter)
    total_lines: int = 0
    foreign_lines: int = 0
    filtered_out: int = 0


def _decode(line: str) -> dict[str, Any] | None:
    text = line.strip()
    if not text:
        return None
    start = text.find("{")
    if start < 0:
        return None
    try:
        obj = json.loads(text[start:])
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
        return None
    return obj


def scan(lines: Iterable[str], camera: str | None = None, since: datetime | None = None,
         until: datetime | None = None) -> LogScan:
    out = LogScan()
    for line in lines:
        out.total_lines += 1
        event = _decode(line)
        if event is None:
            out.foreign_lines += 1
            continue
        when = _event_time(event)
        if when is not None:
            event["_t"] = when
        if (since and (when is None or when < since)) or (until and (when is None or when > until)):
            out.filtered_out += 1
            continue
        name = event["event"]
        if camera is not None and name in ("latency", "request", "action_event",
                                           "skeleton_quality", "feed_health") and \
                str(event.get("camera")) != camera:
            out.filtered_out += 1
            continue
        out.events[name] += 1
        kind = {"latency": out.latency, "system": out.system, "request": out.requests,
                "action_event": out.actions, "skeleton_quality": out.quality,
                "feed_health": out.feeds}.get(name)
        if kind is not None:
            kind.append(event)
    return out


QUALITY_SHARES = ("no_person", "visibility", "low_visibility", "out_of_frame")


def skeleton_quality(log: LogScan) -> list[dict[str, Any]]:
    """Per camera over the span: each share weighted by the frames of its interval, the
    worst interval's usable share, and how many intervals were silent or blocked."""
    by_camera: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in log.quality:
        by_camera[str(e.get("camera"))].append(e)
    out = []
    for camera, records in sorted(by_camera.items()):
        row: dict[str, Any] = {"camera": camera, "intervals": len(records),
                               "frames": sum(int(r.get("frames") or 0) for r in records),
                               "silent": sum(bool(r.get("silent")) for r in records),
                               "blocked": sum(bool(r.get("blocked")) for r in records)}
        for name in QUALITY_SHARES:
            pairs = [(v, n) for v, n in ((number(r.get(name)), int(r.get("frames") or 0))
                                         for r in records) if v is not None and n]
            weight = sum(n for _, n in pairs)
            row[name] = sum(v * n for v, n in pairs) / weight if weight else None
        usable = [number(r.get("usable")) for r in records]
        row["worst_usable"] = min((u for u in usable if u is not None), default=None)
        out.append(row)
    return out


def action_spans(log: LogScan) -> list[dict[str, Any]]:
    """Each action event as one span (its start and end lines paired by id), by camera and
    start; an event still open when the log ends has `ended` None; `alarm`: when the start
    was said (its message's `at`; None where the log lacks the start)."""
    spans: dict[str, dict[str, Any]] = {}
    for e in log.actions:
        span = spans.setdefault(str(e.get("id")), {
            "camera": str(e.get("camera")), "model": e.get("model"), "class": e.get("class"),
            "started": number(e.get("started")), "ended": None, "peak": number(e.get("peak")),
            "reason": None, "alarm": None})
        if e.get("kind") == "start":
            span["alarm"] = number(e.get("at"))
        elif e.get("kind") == "end":
            span.update(ended=number(e.get("ended")), peak=number(e.get("peak")),
                        reason=e.get("reason"))
    return sorted(spans.values(), key=lambda s: (s["camera"], s["started"] or 0.0))


def _weighted_percentile(pairs: list[tuple[float | None, int]], percent: float) -> float | None:
    """Percentile of values each standing for `weight` samples (None values are left out)."""
    valued = sorted((v, w) for v, w in pairs if v is not None and w > 0)
    if not valued:
        return None
    ends = list(itertools.accumulate(w for _, w in valued))  # the last rank each value holds
    return valued[bisect.bisect_right(ends, math.floor(percent / 100 * (ends[-1] - 1)))][0]


def _range(values: Iterable[Any]) -> dict[str, float] | None:
    nums = [v for v in (number(x) for x in values) if v is not None]
    if not nums:
        return None
    return {"min": min(nums), "mean": round(sum(nums) / len(nums), 3), "max": max(nums)}


def _iso(when: datetime | None) -> str | None:
    return when.isoformat().replace("+00:00", "Z") if when else None


def _nearest_system(times: list[datetime], samples: list[dict[str, Any]], when: datetime | None,
                    tolerance_s: float) -> dict[str, Any] | None:
    if when is None or not times:
        return None
    i = bisect.bisect_left(times, when)
    best = None
    for j in (i - 1, i):
        if 0 <= j < len(times):
            dt = abs((times[j] - when).total_seconds())
            if dt <= tolerance_s and (best is None or dt < best[0]):
                best = (dt, samples[j])
    return best[1] if best else None


def gpu_temp(sample: dict[str, Any]) -> Any:
    # Orin reports the GPU sensor as absent while the GPU is power-gated; fall back to hottest.
    return sample.get("gpu_temp_c") if sample.get("gpu_temp_c") is not None \
        else sample.get("temp_max_c")


def summarize(log: LogScan) -> dict[str, Any]:
    timed_system = sorted((e for e in log.system if "_t" in e), key=lambda e: e["_t"])
    sys_times = [e["_t"] for e in timed_system]
    all_times = [e["_t"] for e in (*log.latency, *log.system, *log.requests) if "_t" in e]

    def key(e: dict[str, Any]) -> tuple[str, str]:
        return str(e.get("camera")), str(e.get("model"))

    intervals: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in sorted(log.latency, key=lambda e: e.get("_t") or datetime.min.replace(
            tzinfo=timezone.utc)):
        intervals[key(rec)].append(rec)
    requests: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for req in log.requests:
        requests[key(req)].append(req)
    # A stream may be seen only through request events.
    out_streams = [_stream_summary(*k, intervals[k], requests[k], sys_times, timed_system)
                   for k in sorted({*intervals, *requests})]
    system = {"samples": len(log.system),
              "sources": sorted({str(e.get("source")) for e in log.system}),
              **{name: _range(gpu_temp(e) if name == "gpu_temp_c" else e.get(name)
                              for e in log.system) for name in SYSTEM_RANGE_FIELDS}}
    return {
        "lines": {"total": log.total_lines, "skipped_not_ours": log.foreign_lines,
                  "filtered_out": log.filtered_out},
        "span": {"first": _iso(min(all_times)) if all_times else None,
                 "last": _iso(max(all_times)) if all_times else None},
        "events": dict(sorted(log.events.items())),
        "streams": out_streams,
        "system": system,
        "action_events": action_spans(log),
        "skeleton_quality": skeleton_quality(log),
    }


def _stream_summary(camera: str, model: str, intervals: list[dict[str, Any]],
                    requests: list[dict[str, Any]], sys_times: list[datetime],
                    timed_system: list[dict[str, Any]]) -> dict[str, Any]:
    def total(name: str) -> int:
        return int(sum(number(r.get(name)) or 0 for r in intervals))

    if intervals:
        count = total("count")
        ok = total("ok") if any("ok" in r for r in intervals) else \
            count - total("errors") - total("busy") - total("expired")
        errors, busy, expired = total("errors"), total("busy"), total("expired")
    else:
        outcomes = Counter(str(r.get("outcome", "ok")) for r in requests)
        count = len(requests)
        ok, errors, busy, expired = (outcomes["ok"], outcomes["error"], outcomes["busy"],
                                     outcomes["expired"])
    latency: dict[str, Any]
    timed = sorted(v for v in (number(r.get("total_ms")) for r in requests
                               if r.get("outcome", "ok") == "ok") if v is not None)
    if timed:
        latency = {f"p{p}_ms": timed[math.floor(p / 100 * (len(timed) - 1))]  # lower rank
                   for p in SPAN_PERCENTILES}
        latency.update(max_ms=timed[-1], samples=len(timed),
                       method="exact, from per-request `request` events")
    else:
        weights = [(number(r.get("ok", r.get("count"))) or 0) for r in intervals]
        latency = {}
        for p in SPAN_PERCENTILES:
            pairs = [(number(r.get(f"p{p}_ms")), int(w)) for r, w in zip(intervals, weights)]
            latency[f"p{p}_ms"] = _weighted_percentile(pairs, p)
        p99s = [v for v in (number(r.get("p99_ms")) for r in intervals) if v is not None]
        maxes = [v for v in (number(r.get("max_ms")) for r in intervals) if v is not None]
        latency.update(worst_interval_p99_ms=max(p99s) if p99s else None,
                       max_ms=max(maxes) if maxes else None,
                       method="approximate: count-weighted percentiles of interval values")
    per_interval = []
    for rec in intervals:
        row = {"timestamp": _iso(rec.get("_t"))}
        for name in ("count", "rate_hz", "p50_ms", "p90_ms", "p99_ms", "max_ms", "errors",
                     "busy", "expired"):
            row[name] = rec.get(name)
        tolerance = max(float(number(rec.get("interval_s")) or 0), 5.0)
        sample = _nearest_system(sys_times, timed_system, rec.get("_t"), tolerance)
        for name in INTERVAL_SYSTEM_FIELDS:
            row[name] = (gpu_temp(sample) if name == "gpu_temp_c" else sample.get(name)) \
                if sample else None
        per_interval.append(row)

    def rate(n: int) -> float | None:
        return round(n / count, 4) if count else None

    return {
        "camera": camera, "model": model, "intervals": len(intervals), "requests": count,
        "ok": ok, "errors": errors, "busy": busy, "expired": expired,
        "error_rate": rate(errors), "busy_rate": rate(busy), "expired_rate": rate(expired),
        "latency": latency, "per_interval": per_interval,
    }


def _fmt_range(r: dict[str, float] | None, unit: str = "", scale: float = 1.0) -> str:
    if not r:
        return "-"
    return (f"{r['min'] * scale:.1f} .. {r['max'] * scale:.1f}{unit} "
            f"(mean {r['mean'] * scale:.1f})")


def render_text(summary: dict[str, Any]) -> str:
    lines = []
    span = summary["span"]
    lc = summary["lines"]
    lines.append(f"log span: {span['first'] or '-'} .. {span['last'] or '-'}")
    lines.append(f"lines: {lc['total']} read, {lc['skipped_not_ours']} skipped (not stgcnd JSON), "
                 f"{lc['filtered_out']} outside the filters")
    if summary["events"]:
        lines.append("events: " + ", ".join(f"{k}={v}" for k, v in summary["events"].items()))
    for s in summary["streams"]:
        lines.append("")
        lines.append(f"== camera {s['camera']}  model {s['model']}")
        lines.append(
            # Requests that asked for a prediction (windows, and pushes that completed one):
            # pushes that only added a frame are not timed, so not counted here.
            f"prediction requests {s['requests']} (ok {s['ok']}, errors {s['errors']}"
            f" {_pct(s['error_rate'])}, busy {s['busy']} {_pct(s['busy_rate'])},"
            f" expired {s['expired']} {_pct(s['expired_rate'])}) over {s['intervals']} intervals")
        lat = s["latency"]
        approx = "" if lat["method"].startswith("exact") else "~"
        parts = [f"{approx}p{p} {cell(lat.get(f'p{p}_ms'), 2)}" for p in SPAN_PERCENTILES]
        if "worst_interval_p99_ms" in lat:
            parts.append(f"worst-interval p99 {cell(lat['worst_interval_p99_ms'], 2)}")
        parts.append(f"max {cell(lat.get('max_ms'), 2)}")
        lines.append("latency ms, whole span: " + ", ".join(parts) + f"  [{lat['method']}]")
        if s["per_interval"]:
            lines += table(
                ("time (UTC)", "n", "Hz", "p50", "p90", "p99", "max", "err", "busy", "exp",
                 "gpu%", "MHz", "degC", "W"),
                [((row["timestamp"] or "-")[:23], *(row[k] for k in (
                    "count", "rate_hz", "p50_ms", "p90_ms", "p99_ms", "max_ms", "errors",
                    "busy", "expired")), *(cell(row[k], 0) for k in (
                        "gpu_load_pct", "gpu_freq_mhz", "gpu_temp_c")),
                  None if row["power_total_mw"] is None else row["power_total_mw"] / 1000)
                 for row in s["per_interval"]])
    if summary["skeleton_quality"]:
        lines.append("")
        lines.append("== skeleton quality (shares of frames, or of the present persons' "
                     "joints)")
        lines += table(("camera", "frames", "nobody", "visib.", "lost", "outside",
                        "worst-usable", "silent", "blocked"),
                       [(q["camera"], q["frames"], *(cell(q[k], 2) for k in (
                           "no_person", "visibility", "low_visibility", "out_of_frame",
                           "worst_usable")), q["silent"], q["blocked"])
                        for q in summary["skeleton_quality"]])
    if summary["action_events"]:
        lines.append("")
        lines.append("== action events (UTC)")
        for a in summary["action_events"]:
            start, end = _clock(a["started"]), _clock(a["ended"])
            took = (f"{a['ended'] - a['started']:.1f} s" if a["ended"] is not None
                    and a["started"] is not None else "open")
            lines.append(f"{a['camera']:<12} {start} - {end:<8} {took:>9}  {a['class']}  "
                         f"peak {cell(a['peak'], 2)}  {a['reason'] or 'still open'}")
    sysd = summary["system"]
    lines.append("")
    lines.append(f"== system ({sysd['samples']} samples, source: "
                 f"{', '.join(sysd['sources']) or '-'})")
    for label, key, unit in (("GPU load", "gpu_load_pct", " %"),
                             ("GPU freq", "gpu_freq_mhz", " MHz"), ("GPU temp", "gpu_temp_c", " C"),
                             ("hottest", "temp_max_c", " C"), ("power", "power_total_mw", " W"),
                             ("EMC freq", "emc_freq_mhz", " MHz"), ("CPU", "cpu_pct", " %"),
                             ("RAM used", "ram_used_mb", " MB"), ("daemon RSS", "rss_mb", " MB")):
        lines.append(f"{label:<12} {_fmt_range(sysd[key], unit, 1e-3 if unit == ' W' else 1.0)}")
    return "\n".join(lines) + "\n"


def _clock(unix: float | None) -> str:
    if unix is None:
        return "-"
    return datetime.fromtimestamp(unix, timezone.utc).strftime("%H:%M:%S")


def _pct(rate: float | None) -> str:
    return f"({rate * 100:.1f}%)" if rate is not None else ""
