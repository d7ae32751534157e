"""backend "auto": the runtimes to try in turn, the CPU ones timed and the fastest remembered
in the store; imported by provision.first_that_serves only for a model whose backend is auto."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stgcnd.engines.keys import key_digest
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.errors import BackendUnavailable
from stgcnd.fsutil import atomic_write_json, read_system_file
from stgcnd.log import get_logger
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.provision.load import Choice, ModelLike, load_runtime, loaded
from stgcnd.runtimes import available, cpu_bf16, gpu_present, torch_cuda_available
from stgcnd.runtimes.base import Runner, Runtime
from stgcnd.runtimes.timing import time_round_robin
from stgcnd.versions import module_version

log = get_logger("stgcnd.provision")  # the logger name its lines have always had

AUTO_CACHE_NAME = "auto-backend.json"
AUTO_ROUNDS = 5   # interleaved rounds of the CPU choice; each runtime's fastest round counts


def machine_key() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in (
        read_system_file(Path("/proc/cpuinfo")) or "").splitlines()
        if line.startswith("model name")), "")
    return {"machine": platform.machine(), "cpu": cpu or platform.processor(),
            "cpus": os.cpu_count(), "torch": module_version("torch"),
            "onnxruntime": module_version("onnxruntime")}


def model_key(model: Any) -> dict[str, Any]:
    spec = model.spec
    return {"checkpoint_sha256": model.checkpoint_sha256, "demo_seed":
            spec.seed if spec.is_demo else None, "input_shape": list(spec.input_shape),
            "motion": spec.motion, "layout": spec.layout}


def time_runtimes(runtimes: dict[str, Runtime], rounds: int = AUTO_ROUNDS) -> dict[str, float]:
    """Batch-1 milliseconds of each runtime through its runner: the fastest of `rounds`
    round-robin rounds (runtimes/timing.py, as `stgcnd bench` measures)."""
    runners: list[Runner] = []
    try:
        for rt in runtimes.values():
            runners.append(rt.open_runner((1,), 0))
        _c, t, v, m = next(iter(runtimes.values())).info.input_shape
        x = synthetic_windows(1, t, m, v, seed=5)
        timed = time_round_robin(runners, x, rounds, warmup=1)  # warm-up: one-off allocations
        return {name: min(times) for name, (times, _out, _parts) in zip(runtimes, timed)}
    finally:
        for runner in runners:
            runner.close()


# On a CPU, `precision` is the lowest the user allows; auto measures every runtime and
# precision down to it that can run here and serves the fastest. bf16 only where the CPU does
# it natively (emulated, it is slower than fp32).
_CPU_CANDIDATES = {"fp32": (("torch", "fp32"), ("onnxruntime", "fp32")),
                   "bf16": (("torch", "fp32"), ("onnxruntime", "fp32"), ("torch", "bf16"))}
_CPU_CANDIDATES["fp16"] = _CPU_CANDIDATES["bf16"]
_CPU_CANDIDATES["int8"] = (*_CPU_CANDIDATES["bf16"], ("onnxruntime", "int8"))


def fastest_cpu_runtime(model: Any, options: BuildOptions, store: EngineStore
                        ) -> tuple[str, str, str, Runtime | None]:
    """(runtime, precision, why, loaded): the fastest here of the CPU runtimes and precisions
    that `options.precision` allows; measured once, cached in the store. `loaded` is the
    winner as it was measured (left open, so that it is not loaded twice), None when the
    choice came from the cache."""
    cache_path = store.root / AUTO_CACHE_NAME
    # int8's candidate loads or not by its calibration: a new file (or synthetic calibration
    # allowed) measures again.
    int8 = ({"calibration": options.key_dict("onnxruntime").get("calibration_sha256"),
             "synthetic": options.allow_synthetic_calibration}
            if options.precision == "int8" else None)
    key = key_digest({"model": model_key(model), "machine": machine_key(),
                      "allowed": options.precision, "threads": options.threads, "int8": int8,
                      "v": 2})
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache and not store.remeasure_auto:
        entry = cache[key]
        log.info("auto_backend_cached", backend=entry["backend"], precision=entry["precision"],
                 key=key[:12])
        return (str(entry["backend"]), str(entry["precision"]), _faster(entry["fastest_ms"]),
                None)
    candidates: dict[str, Runtime] = {}
    winner: Runtime | None = None
    unavailable = available()
    bf16 = cpu_bf16()
    try:
        for name, precision in _CPU_CANDIDATES[options.precision]:
            label = f"{name} {precision}"
            reason = unavailable[name] or (None if precision != "bf16" or bf16 else
                                           "this CPU has no bf16 instructions (AVX512-BF16, "
                                           "AMX or Arm BF16)")
            if reason is None:
                try:
                    candidates[label] = load_runtime(
                        model, name, dataclasses.replace(options, precision=precision), store)
                except Exception as exc:  # any candidate may fail: the others still serve
                    reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:  # torch is optional, int8 may lack calibration: go on
                log.info("auto_backend_skipped", backend=name, precision=precision,
                         reason=reason)
        if not candidates:
            raise BackendUnavailable("no CPU runtime can run here; pip install onnxruntime")
        timings = _time_each_that_runs(candidates)
        best = min(timings, key=timings.__getitem__)
        winner = candidates.pop(best)
    finally:
        for runtime in candidates.values():
            runtime.close()
    backend, precision = best.split()
    cache[key] = {"backend": backend, "precision": precision, "allowed": options.precision,
                  "fastest_ms": timings, "machine": machine_key(), "model": model_key(model),
                  "cpu_bf16": bf16, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        atomic_write_json(cache_path, cache)
    except OSError as exc:  # a read-only store: measure again next start, serve now
        log.warning("auto_backend_not_cached", path=str(cache_path), error=exc.strerror)
    log.info("auto_backend_measured", backend=backend, precision=precision,
             allowed=options.precision, cpu_bf16=bf16, rounds=AUTO_ROUNDS,
             **{f"{k.replace(' ', '_')}_ms": round(v, 2) for k, v in timings.items()})
    return backend, precision, _faster(timings), winner


def _time_each_that_runs(candidates: dict[str, Runtime]) -> dict[str, float]:
    """time_runtimes over all candidates; where one fails, each alone, without the failures."""
    try:
        return time_runtimes(candidates)
    except Exception as exc:
        log.warning("auto_backend_timing_failed", error=f"{type(exc).__name__}: {exc}",
                    action="timing each candidate alone")
    timings: dict[str, float] = {}
    for label, runtime in candidates.items():
        try:
            timings.update(time_runtimes({label: runtime}))
        except Exception as exc:
            backend, precision = label.split()
            log.info("auto_backend_skipped", backend=backend, precision=precision,
                     reason=f"{type(exc).__name__}: {exc}")
    if not timings:
        raise BackendUnavailable("no CPU runtime ran a window here (auto_backend_skipped "
                                 "lines say why)")
    return timings


def _faster(timings: dict[str, float]) -> str:
    """"the fastest here (onnxruntime fp32 2.10 ms, torch fp32 3.40 ms per window)"."""
    shown = ", ".join(f"{k} {v:.2f} ms" for k, v in sorted(timings.items(),
                                                           key=lambda kv: kv[1]))
    return f"the fastest here ({shown} per window)" if len(timings) > 1 else \
        "the only CPU runtime here"




def auto_chain(model: ModelLike, options: BuildOptions, store: EngineStore
               ) -> Iterator[Choice]:
    """backend "auto": tensorrt, then torch on CUDA, then the CPU runtimes (the faster here
    first). A runtime that cannot run here is skipped with its reason logged (warning level
    when a GPU is present: there a missing CUDA binding is a problem, not a fact). The caller
    tries each in turn and logs each failure (`backend_fallback`)."""
    gpu = gpu_present()
    unavailable = available()
    trt_skipped = unavailable["tensorrt"]
    if trt_skipped is None:
        yield Choice("tensorrt", dataclasses.replace(options, device="cuda"),
                     "the first choice on a GPU")
    else:
        _skipped("tensorrt", trt_skipped, gpu)
    torch_skipped = unavailable["torch"] or (
        None if torch_cuda_available() else "torch has no CUDA here (a CPU build, or no GPU)")
    if torch_skipped is None:
        precision = "fp16" if options.precision == "int8" else options.precision
        if precision != options.precision:
            log.warning("precision_fallback", backend="torch", asked=options.precision,
                        using=precision, reason="torch has no int8")
        yield Choice("torch", dataclasses.replace(options, device="cuda", precision=precision),
                     "on CUDA, " + (f"as tensorrt cannot run here ({trt_skipped})"
                                    if trt_skipped else "after tensorrt failed"))
    else:
        _skipped("torch (CUDA)", torch_skipped, gpu)
    cpu_options = dataclasses.replace(options, device="cpu", cuda_graph=False,
                                      compile="off")
    first, precision, why, opened = fastest_cpu_runtime(loaded(model, store, cpu_options),
                                                        cpu_options, store)
    if precision != options.precision:
        log.warning("precision_fallback", backend=first, asked=options.precision,
                    using=precision, reason=f"on this CPU: {why}")
    yield Choice(first, dataclasses.replace(cpu_options, precision=precision), why, opened)
    fp32 = dataclasses.replace(cpu_options, precision="fp32")
    for other in ("torch", "onnxruntime"):
        if unavailable[other] is None and (other, "fp32") != (first, precision):
            yield Choice(other, fp32, f"fp32 on the CPU ({first} {precision} failed)")


def _skipped(runtime: str, reason: str, gpu: bool) -> None:
    if gpu:  # a GPU that a runtime cannot use is worth a warning (a missing CUDA binding)
        log.warning("backend_fallback", runtime=runtime, step="import", reason=reason)
    else:
        log.info("backend_skipped", runtime=runtime, reason=reason)

