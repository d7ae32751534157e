"""The bench's peer rows: the fused module through a user's own torch.compile (#35).

What a GPU user writes instead of running stgcnd: the same fused module the daemon serves, in
the same precision, `torch.compile(m, mode=..., dynamic=False)` for the one batch size they
run (static shapes, inductor capturing its own CUDA graphs in the modes that have them), host
numpy in and host logits out. Each row runs in a fresh Python process
(`stgcnd_tools.bench.peer_child`), so that no row inherits dynamo's or inductor's state from
another (a second batch size in one process would make the kernels dynamic in the batch).
Its times are that process's own: it is not in the round-robin of the in-process rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import stgcnd
import stgcnd_tools
from stgcnd.errors import BackendUnavailable
from stgcnd.model.spec import ModelSpec

# bench name -> torch.compile's mode, as the user writes it
PEER_MODES = {"torch.compile": "reduce-overhead", "torch.compile-default": "default",
              "torch.compile-max-autotune": "max-autotune"}
_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # inductor's CUDA graphs (CUDA only)


def describe(mode: str | None, device: str) -> str:
    """What a peer row is, in one line (the bench prints it, and it is the row's note)."""
    if mode is None:
        return "the fused module uncompiled, fresh process"
    graphs = ("inductor's CUDA graphs" if mode in _GRAPH_MODES and device == "cuda"
              else "no CUDA graphs")
    return (f"torch.compile(mode={mode!r}, dynamic=False), one compile per batch size, "
            f"{graphs}, fresh process")


@dataclass
class PeerJob:
    """What the child runs: the model (a ModelSpec's fields), how, and where its files are."""

    spec: dict[str, object]
    precision: str
    device: str
    mode: str | None        # None: the fused module uncompiled (the plumbing's own check)
    iterations: int
    warmup: int
    windows: str = ""       # .npy of the batch (n, 3, T, V, M)
    result: str = ""        # .npz the child writes: times_ms, logits, first_call_s


@dataclass
class PeerResult:
    times_ms: list[float]
    logits: np.ndarray
    first_call_s: float     # the first call: the compile, cuDNN's autotuning, the warm-up


def check_precision(precision: str, device: str) -> None:
    """The torch runtime's rules: fp16 on CUDA, bf16 on the CPU, no int8."""
    if precision == "fp16" and device != "cuda":
        raise BackendUnavailable("fp16 needs --device cuda")
    if precision == "bf16" and device != "cpu":
        raise BackendUnavailable("bf16 is offered by torch on the CPU only")
    if precision not in ("fp32", "fp16", "bf16"):
        raise BackendUnavailable(f"torch runs fp32, fp16 or bf16, not {precision}")


def run_peer(spec: ModelSpec, job: PeerJob, x: np.ndarray, cache_dir: Path | None = None,
             timeout: float | None = None) -> PeerResult:
    """One peer row in a fresh process; a failure is a BackendUnavailable with the child's
    last lines. `cache_dir`: inductor's on-disk caches (kernels only, not dynamo's state)
    unless TORCHINDUCTOR_CACHE_DIR is set."""
    fields = {k: v for k, v in asdict(spec).items() if k not in ("extra", "labels")}
    if fields.get("checkpoint") is not None:
        fields["checkpoint"] = str(fields["checkpoint"])
    env = dict(os.environ)
    if cache_dir is not None and "TORCHINDUCTOR_CACHE_DIR" not in env:
        cache_dir.mkdir(parents=True, exist_ok=True)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    # This process's stgcnd and tools, wherever they were found
    here = [str(Path(str(m.__file__)).resolve().parents[1]) for m in (stgcnd, stgcnd_tools)]
    paths = [*here, *env.get("PYTHONPATH", "").split(os.pathsep)]
    env["PYTHONPATH"] = os.pathsep.join(p for p in dict.fromkeys(paths) if p)
    with tempfile.TemporaryDirectory(prefix="stgcnd-bench-peer-") as tmp:
        job.spec, job.windows, job.result = fields, f"{tmp}/x.npy", f"{tmp}/result.npz"
        np.save(job.windows, x)
        (Path(tmp) / "job.json").write_text(json.dumps(asdict(job)))
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "stgcnd_tools.bench.peer_child", f"{tmp}/job.json"],
                capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BackendUnavailable(f"no result within {timeout:.0f} s") from None
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise BackendUnavailable(f"the child exited {proc.returncode}: {tail[-600:]}")
        with np.load(job.result) as r:
            return PeerResult([float(t) for t in r["times_ms"]], np.array(r["logits"]),
                              float(r["first_call_s"]))
