"""`stgcnd bench`: latency / throughput of every backend against PyTorch eager fp32."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from stgcnd.model.graph import LAYOUTS
from stgcnd_tools.bench.report import format_table, write_csv, write_json
from stgcnd_tools.bench.runner import BENCH_BACKENDS, BenchConfig, run_bench


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="benchmark backends against PyTorch eager fp32",
        description="Time every backend and precision on this machine against the baseline, "
                    "PyTorch eager fp32 of the plain network (host numpy in, host logits out). "
                    "Prints a table; --json/--csv write the rows. Progress goes to stderr.")
    g = p.add_argument_group("model")
    g.add_argument("--checkpoint", type=Path, default=None,
                   help="st-gcn checkpoint; omitted: the demo model (same speed, meaningless "
                        "predictions)")
    g.add_argument("--layout", default="mediapipe", choices=sorted(LAYOUTS),
                   help="skeleton layout (default: mediapipe, 33 joints)")
    g.add_argument("--motion", default="first-difference",
                   choices=("first-difference", "second-difference"),
                   help="motion stream formula (default: first-difference)")
    g.add_argument("--frames", type=int, default=150, help="window length T (default: 150)")
    g.add_argument("--persons", type=int, nargs="+", default=[1],
                   help="person slots M, one table block each (default: 1)")
    g.add_argument("--baseline-graph-op", default="einsum", choices=("einsum", "matmul"),
                   help="how the baseline's plain network writes the graph step (default: "
                        "einsum, the original st-gcn formulation users train with)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the backends run (default: cpu)")
    p.add_argument("--backends", nargs="+", default=None, choices=BENCH_BACKENDS,
                   help="backends to time besides the eager baseline (default: all that run "
                        "on --device)")
    p.add_argument("--precisions", nargs="+", default=None,
                   choices=("fp32", "fp16", "bf16", "int8"),
                   help="default: fp32 on cpu; fp32 fp16 on cuda (bf16: torch on the CPU "
                        "only; int8: onnxruntime / tensorrt)")
    p.add_argument("--batch", dest="batches", type=int, nargs="+", default=[1],
                   help="batch sizes (default: 1)")
    p.add_argument("--sessions", type=int, nargs="+", default=[1],
                   help="concurrent sessions, one thread and one CUDA stream each (default: 1)")
    p.add_argument("--iterations", type=int, default=None,
                   help="timed calls per row (default: 20 on cpu, 200 on cuda)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed calls first (default: 3 on cpu, 20 on cuda)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch / ONNX Runtime (default 0: the runtime's choice)")
    p.add_argument("--engines", "--store", dest="store", type=Path, default=None,
                   help="engine store directory for ONNX Runtime / TensorRT artefacts")
    p.add_argument("--trtexec", action="store_true",
                   help="also run trtexec on TensorRT engines: GPU-compute median/p99 columns")
    p.add_argument("--peak-gflops", type=float, default=None, metavar="GFLOPS",
                   help="the device's peak for the precisions timed, for the 'of peak' column "
                        "(known without it: H100 and H200 at fp16/bf16)")
    p.add_argument("--json", type=Path, default=None, help="write the rows as a JSON list")
    p.add_argument("--csv", type=Path, default=None, help="write the rows as CSV")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = BenchConfig(**{f.name: getattr(args, f.name) for f in fields(BenchConfig)
                         if f.name in vars(args)})
    rows = run_bench(cfg)
    print(format_table(rows))
    if args.json:
        write_json(args.json, rows)
    if args.csv:
        write_csv(args.csv, rows)
    return 0
