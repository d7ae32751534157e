"""The load test's report: one JSON-ready dict computed from every camera's raw records, and
the table printed from it. What each figure counts is listed above `build_report`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stgcnd_tools.loadtest.camera import LOST, CameraResult, ModelTarget
from stgcnd_tools.loadtest.daemon_cpu import per_request
from stgcnd_tools.loadtest.plan import LoadPlan
from stgcnd_tools.stats import count_codes, distribution, merge, rate, select
from stgcnd_tools.table import table

# An open-loop send starting later than this after its due time counts as late.
LATE_MS = 1.0


def _counts(cols: dict[str, np.ndarray]) -> dict[str, Any]:
    code = cols["code"]
    lost = int(np.count_nonzero(code == LOST))
    errors = count_codes(code[code != LOST])
    return {"requests": int(code.size), "replies": int(code.size) - lost,
            "predictions": int(np.count_nonzero(cols["predicted"])),
            "errors": errors, "error_replies": sum(errors.values()), "lost_replies": lost}


def _latency(cols: dict[str, np.ndarray]) -> dict[str, Any]:
    ok = cols["code"] == ""
    pred = cols["predicted"]
    return {
        "round_trip_ms": distribution(cols["rtt_ms"][ok]),
        "round_trip_from_send_ms": distribution(cols["rtt_send_ms"][ok]),
        "prediction_round_trip_ms": distribution(cols["rtt_ms"][pred]),
        "server_ms": {name: distribution(cols[f"{name}_ms"][pred])
                      for name in ("queue", "compute", "total")},
        "overhead_ms": distribution(cols["rtt_send_ms"][pred] - cols["compute_ms"][pred]),
    }


def _in(cols: dict[str, np.ndarray], start: float, end: float) -> np.ndarray:
    return (cols["t"] >= start) & (cols["t"] < end)


def _join(plan: LoadPlan, cameras: list[CameraResult]) -> dict[str, Any] | None:
    if not plan.join:
        return None
    joiners = [c for c in cameras if c.joining]
    running = [c for c in cameras if not c.joining]
    start = plan.join_time
    end = min(start + plan.join_window, plan.end)
    watched = merge(c.columns for c in running)
    watched = select(watched, _in(watched, start, end)) if watched else watched
    joined = merge(c.columns for c in joiners)
    joined = select(joined, _in(joined, plan.warmup, plan.end))
    first = [c.first_reply_ms for c in joiners]
    return {
        "cameras": len(joiners), "at_s": start - plan.warmup, "window_s": end - start,
        "first_reply_ms": {**distribution([f for f in first if f is not None]),
                           "per_camera": {c.camera_id: c.first_reply_ms for c in joiners}},
        "first_prediction_ms": distribution(
            [c.first_prediction_ms for c in joiners if c.first_prediction_ms is not None]),
        "never_replied": sum(f is None for f in first),
        "joining_cameras": {**_counts(joined),
                            "round_trip_ms": distribution(joined["rtt_ms"][joined["code"] == ""])},
        "running_cameras": ({**_counts(watched), "round_trip_ms": distribution(
            watched["rtt_ms"][watched["code"] == ""])} if watched else None),
    }


def _camera_row(plan: LoadPlan, c: CameraResult) -> dict[str, Any]:
    cols = select(c.columns, _in(c.columns, plan.warmup, plan.end))
    rtt = distribution(cols["rtt_ms"][cols["code"] == ""])
    counts = _counts(cols)
    return {"camera": c.camera_id, "joining": c.joining, "start_s": c.start, **counts,
            "dropped_sends": c.dropped,
            "round_trip_p50_ms": rtt["p50"], "round_trip_p99_ms": rtt["p99"],
            "first_reply_ms": c.first_reply_ms, "stopped": c.stopped}


# Over the measured interval (requests *due* in [warmup, warmup + duration)): replies =
# requests - lost (no reply within --timeout-ms); windows_per_s = predictions / duration.
# round_trip_ms is from the due time in open loop (a late send cannot hide queueing), from the
# send in closed loop; overhead_ms = round trip from the send - the server's compute_ms.
# daemon_cpu: docs/performance.md, "CPU per request"; floor: echo_floor.py (--scenario only);
# load_cpu: the load processes' own CPU over the whole run, per request they sent.
def build_report(plan: LoadPlan, target: ModelTarget, cameras: list[CameraResult],
                 samples: dict[str, Any], model: dict[str, Any] | None = None,
                 served: dict[str, Any] | None = None,
                 floor: dict[str, Any] | None = None) -> dict[str, Any]:
    cols = merge(c.columns for c in cameras)
    cols = select(cols, _in(cols, plan.warmup, plan.end))
    counts = _counts(cols)
    open_loop = None
    if not plan.closed_loop:
        open_loop = {"late_sends": int(np.count_nonzero(cols["lag_ms"] > LATE_MS)),
                     "late_ms": LATE_MS,
                     "dropped_sends": sum(c.dropped for c in cameras),
                     "send_lag_ms": distribution(cols["lag_ms"])}
    cpu = per_request(samples["first"], samples["last"], counts["replies"])
    cpu["sampled_s"] = [samples["first_at_s"] - plan.warmup, samples["last_at_s"] - plan.warmup]
    sent = sum(c.columns["code"].size for c in cameras)  # the whole run, like load_cpu_s
    load_cpu_s = samples.get("load_cpu_s")
    return {
        "config": plan.to_dict(),
        "model": model or {"name": target.name, "input_shape": list(target.input_shape),
                           "stride": target.stride},
        "served": served,
        "measured_s": plan.duration,
        **counts,
        "windows_per_s": rate(counts["predictions"], plan.duration),
        "requests_per_s": rate(counts["replies"], plan.duration),
        **_latency(cols),
        "open_loop": open_loop,
        "daemon_cpu": cpu,
        "floor": floor,
        "load_cpu": {"cpu_s": load_cpu_s, "requests": sent,
                     "us_per_request": (load_cpu_s / sent * 1e6 if load_cpu_s is not None and sent
                                        else None)},
        "join": _join(plan, cameras),
        "stopped_cameras": {c.camera_id: c.stopped for c in cameras if c.stopped},
        "cameras": [_camera_row(plan, c) for c in cameras],
    }


def has_failures(report: dict[str, Any]) -> bool:
    """Errors, lost replies or stopped cameras anywhere in the measured interval."""
    return bool(report["error_replies"] or report["lost_replies"] or report["stopped_cameras"])


# -- the table ------------------------------------------------------------------------------

def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _codes(errors: dict[str, int], lost: int) -> str:
    parts = [f"{code} {n}" for code, n in errors.items()]
    if lost:
        parts.append(f"lost {lost}")
    return ", ".join(parts) or "none"


def format_table(r: dict[str, Any]) -> str:
    cfg, m = r["config"], r["model"]
    loop = "closed loop" if cfg["closed_loop"] else f"open loop at {cfg['rate_hz']:g} Hz"
    lines = [
        f"stgcnd loadtest: {cfg['processes']} process(es) x {cfg['cameras_per_process']} "
        f"camera(s), {cfg['mode']} mode, {loop}, {r['measured_s']:g} s measured after "
        f"{cfg['warmup_s']:g} s warm-up",
        f"model {m['name']} ({m.get('backend', '?')}, {m.get('precision', '?')}) input "
        f"{tuple(m['input_shape'])} at {cfg['endpoint']}",
        f"  windows/s {r['windows_per_s']:.1f}   requests/s {r['requests_per_s']:.1f}   "
        f"replies {r['replies']}   predictions {r['predictions']}",
        f"  errors: {_codes(r['errors'], r['lost_replies'])}",
    ]
    dists = [("round trip", r["round_trip_ms"])]
    if not cfg["closed_loop"]:
        dists.append(("round trip from send", r["round_trip_from_send_ms"]))
    if cfg["mode"] == "push":
        dists.append(("round trip, predictions", r["prediction_round_trip_ms"]))
    dists += [(f"server {name}", d) for name, d in r["server_ms"].items()]
    dists.append(("overhead (rt - compute)", r["overhead_ms"]))
    lines += table(("ms", "p50", "p90", "p99", "max", "count"),
                   [(name, *(_ms(d[k]) for k in ("p50", "p90", "p99", "max")), d["count"])
                    for name, d in dists], indent="  ", rule=False)
    lines += _cpu_lines(r["daemon_cpu"])
    load = r["load_cpu"]
    if load["us_per_request"] is not None:
        lines.append(f"  load generator CPU per request: {load['us_per_request']:.1f} us")
    ol = r["open_loop"]
    if ol is not None:
        lines.append(f"  open loop: {ol['late_sends']} late sends (> {ol['late_ms']:g} ms; send "
                     f"lag p99 {_ms(ol['send_lag_ms']['p99'])} ms), {ol['dropped_sends']} "
                     "dropped")
    j = r["join"]
    if j is not None:
        fr, new = j["first_reply_ms"], j["joining_cameras"]
        lines.append(f"  join: {j['cameras']} camera(s) at {j['at_s']:g} s: first reply p50 "
                     f"{_ms(fr['p50'])} ms, max {_ms(fr['max'])} ms, {j['never_replied']} never "
                     f"replied; their errors: {_codes(new['errors'], new['lost_replies'])}")
        run = j["running_cameras"]
        if run is not None:
            lines.append(f"        running cameras in the {j['window_s']:g} s after the join: "
                         f"errors: {_codes(run['errors'], run['lost_replies'])}; round trip "
                         f"p99 {_ms(run['round_trip_ms']['p99'])} ms")
    for camera, why in r["stopped_cameras"].items():
        lines.append(f"  camera {camera} stopped: {why}")
    if r.get("floor") is not None:
        lines.append(_floor_line(r["floor"]))
    return "\n".join(lines)


def _cpu_lines(cpu: dict[str, Any]) -> list[str]:
    if cpu["us_per_request"] is None:
        return [f"  daemon CPU per request: n/a ({cpu['note']})"]
    line = (f"  daemon CPU per request: {cpu['us_per_request']:.1f} us over {cpu['requests']:,} "
            f"requests it read ({cpu['source']}")
    proc = cpu.get("proc_us_per_request")
    line += f"; /proc: {proc:.1f} us)" if proc is not None else ")"
    lines = [line]
    if cpu.get("other_clients"):
        lines.append(f"    other clients shared the daemon: it read {cpu['requests']:,} requests, "
                     f"this load got {cpu['load_replies']:,} replies; the figure is over all")
    return lines


def _floor_line(floor: dict[str, Any]) -> str:
    if "note" in floor:
        return f"  floor: not measured ({floor['note']})"
    rt, echo = floor["round_trip_ms"], floor["echo_cpu_us_per_request"]
    cpu = f"{echo:.1f} us" if echo is not None else "not measured (too few requests)"
    return (f"  floor (bare ZeroMQ {floor['transport']} echo, {floor['processes']} x "
            f"{floor['cameras']} camera(s) at {floor['rate_hz']:g} Hz for "
            f"{floor['seconds']:g} s): round trip p50 {_ms(rt['p50'])} / p99 "
            f"{_ms(rt['p99'])} ms; echo CPU per request {cpu}")
