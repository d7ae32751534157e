"""`compile = "max-autotune"`: inductor's autotuned kernels, tried bucket by bucket in a process
of their own before they serve.

A kernel that faults on the GPU ends the CUDA context of its process, so no process that serves
may run one first. A trial process compiles each bucket with max-autotune inside the runner's
CUDA graph, replays it and compares the logits with the fp32 reference; a bucket whose trial
fails, faults, runs out of time or is not faster than inductor's default kernels (timed in
turns with them, same bucket, same runner) serves the default kernels. Inductor's caches live in
the engine store, so the daemon's own compile of a tried bucket reads them (seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Dict

import numpy as np

from stgcnd.log import configure_logging, get_logger, logging_config

log = get_logger(__name__)

TUNED = "max-autotune"
FALLBACK = "reduce-overhead"
# fp16 against the fp32 reference, relative to the logits' scale (the runtime tests' bound).
RELATIVE_TOLERANCE = 2e-2
# A cold bucket took up to 260 s on an H200 (M=1, batch 64, both streams): docs/performance.md.
BUCKET_TIMEOUT_S = 1800.0

Trials = Dict[str, Dict[str, Any]]  # bucket (a str: a JSON key) -> mode, why, figures


def try_buckets(spec: dict[str, Any], precision: str, buckets: Sequence[int], store_root: Path,
                python: Sequence[str] = (sys.executable,),
                timeout_s: float = BUCKET_TIMEOUT_S) -> Trials:
    """Each bucket's verdict: {"mode": max-autotune | reduce-overhead, ...}. A trial process
    that dies takes only the bucket it was trying with it; the next one tries the rest.
    `python`: the interpreter that runs the trial (stgcnd's own, unless a test needs another)."""
    trials: Trials = {}
    left = sorted(set(buckets), reverse=True)  # the largest first: the slowest to compile
    while left:
        why_none = _run_trial(spec, precision, left, store_root, python, timeout_s, trials)
        if why_none is not None:  # the process tried nothing: a second one would not either
            trials.update({str(b): {"mode": FALLBACK, "why": why_none} for b in left})
        left = [b for b in left if str(b) not in trials]
    return trials


def _run_trial(spec: dict[str, Any], precision: str, buckets: list[int], store_root: Path,
               python: Sequence[str], timeout_s: float, trials: Trials) -> str | None:
    """One trial process over `buckets`: its verdicts, and the bucket it died on, into
    `trials`. Returns why it tried no bucket at all, or None."""
    with tempfile.TemporaryDirectory(prefix="stgcnd-autotune-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"spec": spec, "precision": precision, "buckets": buckets,
                                   "store_root": str(store_root),
                                   # its logs beside ours; its stdout is the verdicts
                                   "log": {**logging_config(), "stream": "stderr"}}))
        proc = subprocess.Popen([*python, "-m", __name__, str(job)], stdout=subprocess.PIPE,
                                text=True)
        deadline = [time.monotonic() + timeout_s]
        out_of_time = threading.Event()

        def watch() -> None:  # a bucket that hangs is ended, not waited for
            while proc.poll() is None:
                if time.monotonic() > deadline[0]:
                    out_of_time.set()
                    proc.kill()
                time.sleep(0.2)

        threading.Thread(target=watch, name="autotune-watch", daemon=True).start()
        trying: int | None = None
        tried = False
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # one JSON object a line; anything else is not ours
                msg = json.loads(line) if line.startswith("{") else {}
                if msg.get("trial") != 1:
                    continue
                if "trying" in msg:
                    trying, tried = int(msg["trying"]), True
                    deadline[0] = time.monotonic() + timeout_s
                    continue
                trials[str(msg["bucket"])] = msg["verdict"]
                log.info("torch_autotune_bucket", bucket=msg["bucket"], **msg["verdict"])
                trying = None
            rc = proc.wait()
        finally:
            if proc.poll() is None:  # the build is cancelled (SIGTERM): the trial goes too
                proc.kill()
                proc.wait()
        ended = (f"its trial ran past {timeout_s:.0f} s" if out_of_time.is_set()
                 else f"the trial process ended with exit status {rc}")
        if trying is not None:
            why = ended + " while trying it (a kernel fault ends the CUDA context)"
            trials[str(trying)] = {"mode": FALLBACK, "why": why}
            log.warning("torch_autotune_bucket", bucket=trying, mode=FALLBACK, why=why)
        return None if tried else ended + " before trying a bucket"


def tuned_buckets(manifest: dict[str, Any]) -> frozenset[int]:
    """The buckets a stored torch manifest says serve autotuned kernels."""
    trials = (manifest.get("builder") or {}).get("autotune") or {}
    return frozenset(int(b) for b, t in trials.items() if t.get("mode") == TUNED)


def _verdict(result: dict[str, Any], bound: float, seconds: float, compile_failed: bool,
             tuned_ms: float | None = None, default_ms: float | None = None) -> dict[str, Any]:
    """A bucket's verdict from its comparison with the fp32 reference (engines/validate.py)
    and, where both were timed, with the default kernels: autotuned kernels that are not
    faster serve nothing (a bucket keeps the default ones, and its compile takes seconds)."""
    if compile_failed:  # the runtime fell back to the uncompiled module: say so
        return {"mode": FALLBACK, "why": "max-autotune failed to compile it (the "
                "torch_compile_failed log line says why)"}
    ok = result["finite"] and result["max_abs_diff"] <= bound
    faster = tuned_ms is None or default_ms is None or tuned_ms < default_ms
    verdict = {"mode": TUNED if ok and faster else FALLBACK,
               "max_abs_diff": result["max_abs_diff"], "bound": bound,
               "seconds": round(seconds, 1)}
    if tuned_ms is not None and default_ms is not None:
        verdict.update(tuned_ms=round(tuned_ms, 3), default_ms=round(default_ms, 3))
    if not ok:
        verdict["why"] = "its logits differ from the fp32 reference beyond the bound"
    elif not faster:
        verdict["why"] = (f"its autotuned kernels took {tuned_ms:.3f} ms against the default "
                          f"kernels' {default_ms:.3f} ms")
    return verdict


TIMED_ROUNDS = 5     # a bucket's two runners are timed in turns: drift hits both alike
TIMED_CALLS = 10     # calls a round; the verdict compares the medians of all of them


def _time_in_turns(runners: list[Callable[[], object]]) -> list[float]:
    """Each runner's median call in ms, the runners called in turns (after one warm call)."""
    calls: list[list[float]] = [[] for _ in runners]
    for run in runners:
        run()
    for _ in range(TIMED_ROUNDS):
        for run, times in zip(runners, calls):
            for _ in range(TIMED_CALLS):
                t0 = time.perf_counter()
                run()
                times.append((time.perf_counter() - t0) * 1e3)
    return [float(np.median(times)) for times in calls]


def _trial_main(job_path: str) -> None:
    """In the trial process: per bucket, a `trying` line, then its verdict line."""
    # The trial process exists to run torch: its imports are this function's.
    from stgcnd.engines.validate import compare_logits, default_windows
    from stgcnd.model.reference import load_for_inference as load_model
    from stgcnd.model.reference import reference_logits
    from stgcnd.model.spec import ModelSpec
    from stgcnd.runtimes import runtime_module

    torch_runtime = runtime_module("torch")
    TorchRuntime = torch_runtime.TorchRuntime

    job = json.loads(Path(job_path).read_text())
    configure_logging(**job["log"])
    model = load_model(ModelSpec(**job["spec"]))
    buckets: list[int] = job["buckets"]
    windows = default_windows(model.spec, max(buckets))
    # Before any bucket: no CUDA ends the process here (no bucket blamed), no Triton says so.
    why_not = torch_runtime.torch_compile.unavailable(torch_runtime.cuda_device())
    for b in buckets:
        verdict: dict[str, Any] = {"mode": FALLBACK, "why": f"max-autotune cannot run here: "
                                   f"{why_not}"}
        if why_not is None:
            print(json.dumps({"trial": 1, "trying": b}), flush=True)
            # Autotuned kernels for `b` alone: a runner always holds bucket 1 too, which runs
            # the default kernels here unless it is the one tried, so a fault is b's.
            t0 = time.perf_counter()
            runtime = TorchRuntime(model, job["precision"], "cuda", cuda_graph=True,
                                   max_batch=b, compile_mode=TUNED,
                                   compile_cache=Path(job["store_root"]),
                                   tuned_batches=frozenset({b}))
            runner = runtime.open_runner([b], 0)  # the runner that serves
            batch = list(windows[:b])
            got = runner.run(batch)
            seconds = time.perf_counter() - t0
            ref = reference_logits(model, windows[:b])
            compared = compare_logits(ref, got)  # before the timed calls reuse its buffer
            times: list[float | None] = [None, None]
            if not runtime.compile_failed:
                # The default kernels of the same bucket in the same runner, timed in turns
                # with the tuned ones: tuning keeps only what is faster.
                default = TorchRuntime(model, job["precision"], "cuda", cuda_graph=True,
                                       max_batch=b, compile_mode=FALLBACK,
                                       compile_cache=Path(job["store_root"]))
                default_runner = default.open_runner([b], 0)
                times = list(_time_in_turns([lambda: runner.run(batch),
                                             lambda: default_runner.run(batch)]))
                default_runner.close()
                default.close()
            runner.close()
            verdict = _verdict(compared, RELATIVE_TOLERANCE * float(np.abs(ref).max()),
                               seconds, runtime.compile_failed, *times)
            runtime.close()
        print(json.dumps({"trial": 1, "bucket": b, "verdict": verdict}), flush=True)
    os._exit(0)  # inductor's compile workers: no slow interpreter teardown


if __name__ == "__main__":
    _trial_main(sys.argv[1])
