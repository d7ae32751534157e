"""The parent side of a load test: start the processes, start them together, sample the daemon,
collect every camera's records and hand them to the report.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any

from stgcnd.errors import UserError
from stgcnd_client import Client, ClientError
from stgcnd_tools.loadtest import daemon_cpu
from stgcnd_tools.loadtest.camera import CameraResult, ModelTarget
from stgcnd_tools.loadtest.echo_floor import START_DELAY_S, collect, join
from stgcnd_tools.loadtest.plan import LoadPlan
from stgcnd_tools.loadtest.report import build_report
from stgcnd_tools.loadtest.worker import READY_TIMEOUT_S, process_main

# Spawned processes import numpy and pyzmq and build their data before they are ready.
SPAWN_TIMEOUT_S = 120.0
# The parent's hello and stats calls: at least this long, even with a short --timeout-ms.
CONTROL_TIMEOUT_S = 1.0


def describe_target(info: Any, model: str | None) -> ModelTarget:
    try:
        m = info.model(model)
    except KeyError:
        names = ", ".join(x.name for x in info.models)
        raise UserError(f"the daemon serves no model {model!r}; --model one of: {names}"
                        ) from None
    return ModelTarget(m.name, tuple(m.input_shape), m.stride)


def _sample(control: Client, endpoint: str, served_pid: int | None
            ) -> tuple[float, daemon_cpu.CpuSample]:
    """(when, the daemon's CPU time) now; a failed stats call gives an empty sample."""
    try:
        stats = control.stats()
    except ClientError as exc:
        return time.monotonic(), daemon_cpu.CpuSample(None, None, None, f"stats: {exc}")
    return time.monotonic(), daemon_cpu.sample(stats, endpoint, served_pid)


def run_load(plan: LoadPlan, served_pid: int | None = None,
             served: dict[str, Any] | None = None,
             floor: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run the plan against its endpoint; returns the report (see stgcnd_tools.loadtest.report).
    `floor`, if given, runs once the daemon has answered and before the load starts (the
    bare ZeroMQ floor, which the daemon's goals are judged against); its result is the
    report's `floor`."""
    # The parent's own client: hello at the start, then the two stats samples.
    with Client(plan.endpoint, camera_id=f"lt-{plan.run_id}-control", retries=1,
                timeout=max(CONTROL_TIMEOUT_S, plan.timeout_ms / 1e3),
                server_key=plan.server_key, client_key=plan.client_key) as control:
        try:
            info = control.hello()
        except ClientError as exc:
            raise UserError(f"cannot reach the daemon at {plan.endpoint}: {exc}; start it "
                            "(stgcnd serve) or use --serve") from None
        target = describe_target(info, plan.model)
        measured_floor = floor() if floor is not None else None
        cameras, samples = _run_processes(
            plan, target, lambda: _sample(control, plan.endpoint, served_pid))
    model = info.model(target.name)
    return build_report(plan, target, cameras, samples, model={
        "name": model.name, "input_shape": list(model.input_shape), "backend": model.backend,
        "precision": model.precision, "stride": model.stride, "server": info.server},
        served=served, floor=measured_floor)


def _run_processes(plan: LoadPlan, target: ModelTarget,
                   sample: Callable[[], tuple[float, daemon_cpu.CpuSample]]
                   ) -> tuple[list[CameraResult], dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    go, stop = ctx.Event(), ctx.Event()
    start_wall = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=process_main, name=f"loadtest-{i}", daemon=True,
                         args=(i, plan, target, results, go, start_wall, stop))
             for i in range(plan.processes)]
    for p in procs:
        p.start()
    try:
        collect(results, procs, "ready", SPAWN_TIMEOUT_S + READY_TIMEOUT_S)
        start_wall.value = time.time() + START_DELAY_S
        t0 = time.monotonic() + START_DELAY_S
        go.set()
        _sleep_until(t0 + plan.warmup)
        first_at, first = sample()
        _sleep_until(t0 + plan.end)
        last_at, last = sample()
        done = collect(results, procs, "done", plan.timeout_ms / 1e3 + 60.0)
    except BaseException:
        stop.set()
        go.set()
        raise
    finally:
        join(procs)
    cameras = [c for msg in sorted(done, key=lambda m: m[1]) for c in msg[2]]
    samples = {"first": first, "last": last, "first_at_s": first_at - t0,
               "last_at_s": last_at - t0, "load_cpu_s": sum(msg[3] for msg in done)}
    return cameras, samples


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)
