"""The benchmark engine behind `stgcnd bench` (docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.engines.device import gpu_identity
from stgcnd.engines.options import DEFAULT_BUCKETS, BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.engines.validate import compare_logits
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.log import get_logger
from stgcnd.model.reference import gflop_per_window, load_for_inference
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.provision.load import load_runtime
from stgcnd.runtimes import available, runtime_module
from stgcnd.runtimes.base import Runner, Runtime, RuntimeInfo
from stgcnd.runtimes.timing import Timed, time_round_robin
from stgcnd.server.config import engines_root
from stgcnd_tools.profiling import (
    RunOptions,
    find_trtexec,
    load_times,
    run_trtexec,
    summarize_times,
)
from stgcnd_tools.stats import latency_stats

log = get_logger(__name__)

# The torch runtime's variants: (compile mode, CUDA graphs of our runner). The peer rows (#35):
# what a GPU user writes instead, `torch.compile(fused module, mode=..., dynamic=False)` for the
# one batch size, each in a fresh process (peer_child.py) that inherits no dynamo state.
TORCH_VARIANTS = {"torch": ("off", False), "torch-cudagraph": ("off", True),
                  "torch-compile-cudagraph": ("reduce-overhead", True)}
# `compile = "max-autotune"` as the daemon serves it: through the store, whose build tries the
# bucket's autotuned kernels in a process of their own (engines/builders/torch_autotune.py).
AUTOTUNED = "torch-autotune-cudagraph"
# bench name -> torch.compile's mode as the user writes it
PEER_MODES = {"torch.compile": "reduce-overhead", "torch.compile-default": "default",
              "torch.compile-max-autotune": "max-autotune"}
BENCH_BACKENDS = (*TORCH_VARIANTS, AUTOTUNED, *PEER_MODES, "onnxruntime", "tensorrt",
                  "tensorrt-cudagraph")
BASELINE_NAME = "torch-eager"
# Dense peaks (GFLOP/s) from the vendors' data sheets, by a substring of the device's name and
# the precision; fp32 is left out on GPUs (whether cuDNN uses TF32 decides it). Elsewhere
# --peak-gflops says it.
KNOWN_PEAKS_GFLOPS = {("H100", "fp16"): 989_400.0, ("H100", "bf16"): 989_400.0,
                      ("H200", "fp16"): 989_400.0, ("H200", "bf16"): 989_400.0}


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# Per persons count M and batch B: the baseline (PyTorch eager fp32 of the plain network, host
# numpy in, host logits out) and every backend x precision through the runner the daemon serves
# with, on the same windows, timed round-robin in one process (rotated each round) so that a busy
# stretch of a shared machine falls on all alike; outputs compared with the baseline's. Sessions
# N > 1: N threads, each its own runner, at once (aggregate windows/s, the worst runner's p99).
@dataclass
class BenchConfig:
    checkpoint: Path | None = None
    layout: str = "mediapipe"
    motion: str = "first-difference"
    frames: int = 150
    persons: tuple[int, ...] = (1,)
    device: str = "cpu"
    backends: tuple[str, ...] | None = None     # None: every one that can run on `device`
    precisions: tuple[str, ...] | None = None   # None: fp32 on cpu, fp32 + fp16 on cuda
    batches: tuple[int, ...] = (1,)
    sessions: tuple[int, ...] = (1,)
    iterations: int | None = None               # None: 20 on cpu, 200 on cuda
    warmup: int | None = None                   # None: 3 on cpu, 20 on cuda
    baseline_graph_op: str = "einsum"
    threads: int = 0
    store: Path | None = None
    trtexec: bool = False
    seed: int = 0
    peak_gflops: float | None = None            # the device's peak for every precision
    progress: Callable[[str], None] = field(default=_stderr)

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise UserError(f"--device must be cpu or cuda, got {self.device!r}")
        unknown = [b for b in self.backends or () if b not in BENCH_BACKENDS]
        if unknown:
            raise UserError(f"unknown backend(s) {', '.join(unknown)}; choose from "
                            f"{', '.join(BENCH_BACKENDS)} (the eager baseline always runs)")
        if self.iterations is None:
            self.iterations = 20 if self.device == "cpu" else 200
        if self.warmup is None:
            self.warmup = 3 if self.device == "cpu" else 20
        if self.iterations < 1 or self.warmup < 0:
            raise UserError("--iterations must be >= 1 and --warmup >= 0")
        if min(self.batches) < 1 or min(self.sessions) < 1 or min(self.persons) < 1:
            raise UserError("--batch, --sessions and --persons take values >= 1")


def default_backends(device: str) -> tuple[str, ...]:
    avail = available()
    names: list[str] = ["torch"]
    if device == "cuda":  # max-autotune takes minutes a batch size: named only
        names += ["torch-cudagraph", "torch-compile-cudagraph", "torch.compile"]
    if avail["onnxruntime"] is None:
        names.append("onnxruntime")
    if device == "cuda" and avail["tensorrt"] is None:
        names += ["tensorrt", "tensorrt-cudagraph"]
    return tuple(names)


def default_precisions(device: str) -> tuple[str, ...]:
    return ("fp32",) if device == "cpu" else ("fp32", "fp16")


def describe(mode: str, device: str) -> str:
    """What a peer row is, in one line (printed, and the row's note)."""
    graphs = "inductor's" if device == "cuda" and mode != "default" else "no"
    return (f"torch.compile(mode={mode!r}, dynamic=False), one compile per batch size, "
            f"{graphs} CUDA graphs, fresh process")


def run_peer(spec: ModelSpec, job: dict[str, object], x: np.ndarray, cache_dir: Path
             ) -> tuple[list[float], np.ndarray, float]:
    """One peer row in a fresh process (`job`: precision, device, mode, iterations, warmup):
    its times (ms), last logits and first call (s); a failure is a BackendUnavailable with the
    child's last lines. `cache_dir`: inductor's on-disk caches (kernels, not dynamo state)."""
    job = {**job, "spec": {k: v for k, v in asdict(spec).items() if k not in ("extra", "labels")}}
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}  # torch sets it once used
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # this stgcnd and tools
    with tempfile.TemporaryDirectory(prefix="stgcnd-bench-peer-") as tmp:
        np.save(f"{tmp}/x.npy", x)
        Path(tmp, "job.json").write_text(json.dumps({**job, "dir": tmp}, default=str))
        proc = subprocess.run([sys.executable, "-m", "stgcnd_tools.bench.peer_child",
                               f"{tmp}/job.json"], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise BackendUnavailable(f"the child exited {proc.returncode}: {tail[-600:]}")
        with np.load(f"{tmp}/result.npz") as r:
            return [float(t) for t in r["times_ms"]], r["logits"], float(r["first_call_s"])


def open_backend(cfg: BenchConfig, store: EngineStore, model: Any, name: str, precision: str,
                 batch: int) -> Runtime:
    """A bench backend; ONNX Runtime and TensorRT artefacts come from the store."""
    compile_mode, graph = TORCH_VARIANTS.get(name, ("off", name.endswith("-cudagraph")))
    if (graph or compile_mode != "off") and cfg.device != "cuda":
        raise BackendUnavailable("CUDA graphs and torch.compile need --device cuda")
    if name in TORCH_VARIANTS:
        return runtime_module("torch").TorchRuntime(
            model, precision, cfg.device, cuda_graph=graph, max_batch=batch,
            threads=cfg.threads, compile_mode=compile_mode, compile_cache=store.root)
    base = name[:-len("-cudagraph")] if graph else name  # str.removesuffix: 3.9+
    if precision == "bf16":
        raise BackendUnavailable("bf16 is offered by the torch backend on the CPU only")
    tuned = name == AUTOTUNED
    options = BuildOptions(precision=precision, max_batch=batch,
                           device="cuda" if base == "tensorrt" or tuned else cfg.device,
                           threads=cfg.threads, cuda_graph=graph,
                           compile="max-autotune" if tuned else "off",
                           # the one batch size the row times: one trial, not ten
                           buckets=(batch,) if tuned else DEFAULT_BUCKETS,
                           allow_synthetic_calibration=True)
    return load_runtime(model, "torch" if tuned else base, options, store)


def peak_gflops(cfg: BenchConfig, precision: str) -> float | None:
    if cfg.peak_gflops:
        return cfg.peak_gflops
    gpu = gpu_identity() if cfg.device == "cuda" else None
    return next((v for (part, prec), v in KNOWN_PEAKS_GFLOPS.items()
                 if gpu and part in str(gpu["name"]) and prec == precision), None)


def time_sessions(runtime: Runtime, x: np.ndarray, n: int, iterations: int, warmup: int
                  ) -> dict[str, Any]:
    """Drive n runners from n threads at once, timed from when all are warm; latencies per
    runner, outputs, wall time."""
    sessions = [runtime.open_runner((len(x),), 0) for _ in range(n)]
    warm = threading.Barrier(n + 1)

    def work(session: Runner) -> Timed:
        try:
            for _ in range(warmup):
                session.run(list(x))
        finally:
            warm.wait()  # a failed warm-up too, so that nobody waits for it
        return time_round_robin([session], x, iterations, 0)[0]

    try:
        with ThreadPoolExecutor(n) as pool:
            futures = [pool.submit(work, s) for s in sessions]
            warm.wait()
            t0 = time.perf_counter()
            results = [f.result() for f in futures]  # the first failure is raised
            wall = time.perf_counter() - t0
    finally:
        for s in sessions:
            s.close()
    return {"per_session": [r[0] for r in results], "outputs": [r[1] for r in results],
            "parts": results[0][2], "wall_s": wall}


def _row(name: str, info: RuntimeInfo, x: np.ndarray, persons: int, frames: int,
         sessions: int, timed: dict[str, Any], cfg: BenchConfig, gflop: float | None
         ) -> dict[str, Any]:
    all_times = [t for ts in timed["per_session"] for t in ts]
    stats = latency_stats(all_times)
    batch = x.shape[0]
    peak = peak_gflops(cfg, info.precision)
    wps = (batch * 1e3 / stats["mean_ms"] if sessions == 1 else  # N sessions: all together
           batch * len(all_times) / timed["wall_s"])
    row: dict[str, Any] = {
        "backend": name, "precision": info.precision, "device": info.device,
        "persons": persons, "frames": frames, "batch": batch, "sessions": sessions,
        **stats, "windows_per_s": wps, "iterations": len(all_times),
        "p99_worst_session_ms": (max(latency_stats(t)["p99_ms"] for t in timed["per_session"])
                                 if sessions > 1 else None),
        **timed["parts"],
        "load_avg": os.getloadavg()[0],
    }
    if gflop is not None:
        row["gflops"] = gflop * row["windows_per_s"]
        row["peak_share"] = row["gflops"] / peak if peak else None
    return row


def _compare(row: dict[str, Any], outputs: list[np.ndarray], ref: np.ndarray,
             base_row: dict[str, Any]) -> None:
    compared = [compare_logits(ref, o) for o in outputs]
    row.update({k: max(c[k] for c in compared)  # the worst session's
                for k in ("max_abs_diff", "margin_change_median", "margin_change_max")})
    row["top1_agreement"] = float(np.mean([c["top1_agreement"] for c in compared]))
    if row["sessions"] == 1:
        row["speedup"] = base_row["median_ms"] / row["median_ms"]
        row["speedup_min"] = base_row["min_ms"] / row["min_ms"]
    else:  # throughput of N sessions against the baseline's one
        row["speedup"] = row["windows_per_s"] / base_row["windows_per_s"]


def _trtexec_columns(row: dict[str, Any], engine: str | None, x: np.ndarray,
                     cfg: BenchConfig, name: str) -> None:
    if find_trtexec() is None or engine is None:
        row["note"] = "trtexec not found" if engine else "no engine file"
        return
    shape = "x".join(str(d) for d in x.shape)
    with tempfile.TemporaryDirectory(prefix="stgcnd-bench-trtexec-") as out:
        result = run_trtexec(RunOptions(engine=Path(engine), shapes=f"input:{shape}",
                                        cuda_graph=name.endswith("-cudagraph"), profile=False,
                                        separate_profile_run=False, layer_info=False), out)
        summary = summarize_times(load_times(result.artefacts["times"]), batch=x.shape[0])
    row["trtexec_gpu_compute_median_ms"] = summary["gpu_compute_ms"]["median"]
    row["trtexec_gpu_compute_p99_ms"] = summary["gpu_compute_ms"]["p99"]


def run_bench(cfg: BenchConfig) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    store = EngineStore(engines_root(cfg.store))
    for persons in cfg.persons:
        try:
            spec = ModelSpec(checkpoint=cfg.checkpoint, layout=cfg.layout, persons=persons,
                             frames=cfg.frames, motion=cfg.motion,
                             graph_op=cfg.baseline_graph_op)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        model = load_for_inference(spec)
        for batch in cfg.batches:
            x = synthetic_windows(batch, cfg.frames, persons, spec.num_node, seed=cfg.seed)
            gflop = gflop_per_window(model, x[0])
            names = cfg.backends or default_backends(cfg.device)
            ours, ref = _bench_shape(cfg, store, model, x, persons, gflop,
                                     [n for n in names if n not in PEER_MODES])
            rows += ours
            rows += [row for name in names if name in PEER_MODES
                     for precision in cfg.precisions or default_precisions(cfg.device)
                     for row in _peer_row(cfg, store, spec, (name, precision), x, gflop,
                                          ours[0], ref)]
    return rows


def _peer_row(cfg: BenchConfig, store: EngineStore, spec: ModelSpec, row_of: tuple[str, str],
              x: np.ndarray, gflop: float | None, base_row: dict[str, Any], ref: np.ndarray
              ) -> list[dict[str, Any]]:
    """A peer row, one session (a user's compiled module on one thread), or []."""
    (name, precision), label = row_of, f"[M={spec.persons} B={len(x)}] {row_of[0]} {row_of[1]}"
    what = describe(PEER_MODES[name], cfg.device)
    try:
        if precision not in ("fp32", "fp16" if cfg.device == "cuda" else "bf16"):
            raise BackendUnavailable(f"torch runs {precision} on no {cfg.device}")
        cfg.progress(f"{label}: {what} ...")
        times, logits, first_s = run_peer(spec, {
            "precision": precision, "device": cfg.device, "mode": PEER_MODES[name],
            "iterations": cfg.iterations, "warmup": cfg.warmup},
            x, store.root / "torch-compile" / "peers")
    except BackendUnavailable as exc:
        cfg.progress(f"{label}: skipped ({exc})")
        return []
    info = RuntimeInfo("torch", precision, cfg.device, x.shape[1:], ref.shape[1], len(x))
    row = _row(name, info, x, spec.persons, cfg.frames, 1,
               {"per_session": [times], "parts": {}}, cfg, gflop)
    _compare(row, [logits], ref, base_row)
    row["note"] = f"{what}; first call {first_s:.1f} s"
    cfg.progress(f"{label}: median {row['median_ms']:.2f} ms ({row['speedup']:.2f}x), max|diff| "
                 f"{row['max_abs_diff']:.1e}, first call {first_s:.1f} s")
    return [row]


def _bench_shape(cfg: BenchConfig, store: EngineStore, model: Any, x: np.ndarray, persons: int,
                 gflop: float | None, names: list[str]
                 ) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The in-process rows of one (M, B) and the baseline's logits: the baseline and every
    variant round-robin, then the variants' concurrent sessions (N > 1)."""
    label = f"M={persons} B={len(x)}"
    iters, warm = int(cfg.iterations or 1), int(cfg.warmup or 0)
    opened: list[tuple[str, Runtime]] = [(BASELINE_NAME, runtime_module("torch").TorchRuntime(
        model, "fp32", cfg.device, max_batch=len(x), optimized=False))]
    try:
        for name in names:
            for precision in cfg.precisions or default_precisions(cfg.device):
                try:
                    opened.append((name, open_backend(cfg, store, model, name, precision, len(x))))
                except BackendUnavailable as exc:
                    cfg.progress(f"[{label}] {name} {precision}: skipped ({exc})")
        cfg.progress(f"[{label}] {len(opened)} runners round-robin, {iters} rounds ...")
        runners = [runtime.open_runner((len(x),), 0) for _, runtime in opened]
        try:
            timed = time_round_robin(runners, x, iters, warm)
        finally:
            for runner in runners:
                runner.close()
        (base_name, base), *variants = opened
        base_timed = {"per_session": [timed[0][0]], "parts": timed[0][2]}
        base_row = _row(base_name, base.info, x, persons, cfg.frames, 1, base_timed, cfg, gflop)
        base_row.update(speedup=1.0, speedup_min=1.0, max_abs_diff=0.0, top1_agreement=1.0,
                        margin_change_median=0.0, margin_change_max=0.0,
                        note=f"baseline: plain network, graph_op={cfg.baseline_graph_op}")
        ref = timed[0][1]
        rows = [base_row]
        for (name, runtime), (times, out, parts) in zip(variants, timed[1:]):
            row = _row(name, runtime.info, x, persons, cfg.frames, 1,
                       {"per_session": [times], "parts": parts}, cfg, gflop)
            _compare(row, [out], ref, base_row)
            if cfg.trtexec and name.startswith("tensorrt"):
                _trtexec_columns(row, runtime.info.artifact, x, cfg, name)
            rows.append(row)
            cfg.progress(f"[{label}] {name} {row['precision']}: median {row['median_ms']:.2f} "
                         f"ms ({row['speedup']:.2f}x), min {row['min_ms']:.2f} ms "
                         f"({row['speedup_min']:.2f}x), max|diff| {row['max_abs_diff']:.1e}")
        for name, runtime in variants:
            for n in (n for n in cfg.sessions if n > 1):
                cfg.progress(f"[{label}] {name} {runtime.info.precision} x{n} sessions ...")
                sessions = time_sessions(runtime, x, n, iters, warm)
                row = _row(name, runtime.info, x, persons, cfg.frames, n, sessions, cfg,
                           gflop)
                _compare(row, sessions["outputs"], ref, base_row)
                rows.append(row)
        return rows, ref
    finally:
        for _, runtime in opened:
            runtime.close()
