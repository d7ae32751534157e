"""`stgcnd bench`: every backend x precision against PyTorch eager fp32, on this machine.

    from stgcnd_tools.bench import BenchConfig, run_bench
    rows = run_bench(BenchConfig(device="cpu", persons=(1,), batches=(1,)))
"""

from __future__ import annotations

from stgcnd_tools.bench.runner import BASELINE_NAME, BENCH_BACKENDS, BenchConfig, run_bench
from stgcnd_tools.bench.stats import latency_stats

__all__ = ["BASELINE_NAME", "BENCH_BACKENDS", "BenchConfig", "latency_stats", "run_bench"]
