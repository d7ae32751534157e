"""`stgcnd trtexec run|parse|report`: profile any engine with trtexec and report on it."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from typing import Any

from stgcnd_tools.profiling.parsefile import parse_path, render_text, write_derived
from stgcnd_tools.profiling.report import write_report
from stgcnd_tools.profiling.runner import RunOptions, run_trtexec
from stgcnd_tools.profiling.times import load_times, summarize_times


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "trtexec", help="run trtexec, parse its artefacts, write reports",
        description="Profile a TensorRT engine (ours or any other) with trtexec, parse what "
                    "it writes (TensorRT 8.2-11), and write reports. See docs/trtexec.md.")
    sub = parser.add_subparsers(dest="trtexec_command", metavar="ACTION", required=True)
    _register_run(sub)
    _register_parse(sub)
    _register_report(sub)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _register_run(sub: Any) -> None:
    run = sub.add_parser(
        "run", help="run trtexec and keep its artefacts in one folder",
        description="Run trtexec with --exportTimes, --exportProfile, --exportLayerInfo, "
                    "--profilingVerbosity=detailed and --separateProfileRun; store times.json, "
                    "profile.json, layers.json, trtexec.log, run_config.json and "
                    "engine_metadata.json in --out. Arguments after -- go to trtexec as they are.")
    model = run.add_mutually_exclusive_group(required=True)
    model.add_argument("--engine", type=Path, metavar="PATH", help="serialized engine to load")
    model.add_argument("--onnx", type=Path, metavar="PATH", help="ONNX model to build and run")
    run.add_argument("--shapes", metavar="SPEC",
                     help="input shapes for dynamic engines, e.g. input:1x3x150x33x1")
    run.add_argument("--iterations", type=int, default=200, help="minimum timed iterations "
                     "(default 200)")
    run.add_argument("--warmup-ms", type=int, default=500, help="warm-up time in ms "
                     "(default 500)")
    run.add_argument("--avg-runs", type=int, default=50, help="iterations averaged per log "
                     "line (default 50)")
    run.add_argument("--duration", dest="duration_s", type=float, default=None, metavar="S",
                     help="minimum timed duration in s (trtexec default: 3)")
    # --cuda-graph / --no-cuda-graph by hand: argparse.BooleanOptionalAction is Python 3.9+.
    run.add_argument("--cuda-graph", dest="cuda_graph", action="store_true", default=True,
                     help="capture inference in a CUDA graph (default on)")
    run.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false",
                     help="run without a CUDA graph")
    run.add_argument("--spin-wait", action="store_true",
                     help="spin-wait for GPU completion: steadier timings, one busy CPU core")
    run.add_argument("--no-profile", dest="profile", action="store_false",
                     help="skip the per-layer profile (and its separate run)")
    run.add_argument("--no-separate-profile-run", dest="separate_profile_run",
                     action="store_false",
                     help="profile layers during the timed run (times then include profiling "
                          "overhead)")
    run.add_argument("--no-layer-info", dest="layer_info", action="store_false",
                     help="do not export layer information")
    for flag in ("fp16", "bf16", "int8", "fp8", "best"):
        run.add_argument(f"--{flag}", dest="precisions", action="append_const", const=flag,
                         help=f"pass --{flag} to trtexec (building from --onnx)")
    run.add_argument("--save-engine", type=Path, metavar="PATH",
                     help="with --onnx: keep the engine trtexec builds")
    run.add_argument("--out", type=Path, metavar="DIR",
                     help="run folder (default runs/<model>-<YYYYmmdd-HHMMSS>)")
    run.add_argument("--trtexec", metavar="PATH",
                     help="trtexec binary (default: PATH, then /usr/src/tensorrt/bin/trtexec)")
    run.add_argument("--timeout", type=float, metavar="S", help="stop trtexec after S seconds")
    run.add_argument("--quiet", action="store_true",
                     help="do not mirror trtexec's output on stderr (it is still in the log)")
    run.add_argument("--report", action="store_true", help="write the report when done")
    run.add_argument("--batch", type=_positive_int, default=1,
                     help="windows per inference, for windows/s in the summary (default 1)")
    run.add_argument("extra", nargs="*", metavar="-- TRTEXEC_ARGS",
                     help="further trtexec arguments, after --")
    run.set_defaults(func=run_run)


def _register_parse(sub: Any) -> None:
    parse = sub.add_parser(
        "parse", help="summarise trtexec artefacts (file kind recognised from content)",
        description="Read exportTimes/exportProfile/exportLayerInfo JSON, trtexec logs or TREx "
                    "metadata (a file, or every such file in a folder) and print a summary, or "
                    "the numbers as JSON with --json.")
    parse.add_argument("path", type=Path, metavar="DIR|FILE",
                       help="a trtexec artefact or log (kind recognised from its content), or "
                            "a folder of them")
    parse.add_argument("--json", action="store_true", help="print the parsed numbers as JSON")
    parse.add_argument("--batch", type=_positive_int, default=1,
                       help="windows per inference, for windows/s (default 1)")
    parse.add_argument("--top", type=int, default=10,
                       help="slowest layers to list (0 = all; default 10)")
    parse.add_argument("--count-types", metavar="T1,T2",
                       help="layer types to count, absent ones as 0, e.g. Einsum,MatMul")
    parse.add_argument("--out", type=Path, metavar="DIR",
                       help="also write summary.json/.csv, latency_series.csv, "
                            "latency_percentiles.csv and build/profile.metadata.json here")
    parse.set_defaults(func=run_parse)


def _register_report(sub: Any) -> None:
    report = sub.add_parser(
        "report", help="report.md + report.json + PNG plots for one or more runs",
        description="Write a report for a run folder; with --compare, a side-by-side "
                    "comparison against the first folder (ratios = other / first).")
    report.add_argument("run_dir", type=Path, metavar="DIR",
                        help="a run folder: the --out of `stgcnd trtexec run`, or a folder of "
                             "trtexec artefacts")
    report.add_argument("--compare", type=Path, nargs="+", action="extend", default=[],
                        metavar="DIR", help="further run folders to compare with DIR")
    report.add_argument("--out", type=Path, metavar="DIR",
                        help="where to write the report (default: DIR)")
    report.add_argument("--batch", type=_positive_int, default=1,
                        help="windows per inference, for windows/s (default 1)")
    report.add_argument("--top", type=_positive_int, default=15,
                        help="slowest layers to show (default 15)")
    report.add_argument("--no-plots", dest="plots", action="store_false",
                        help="skip the PNG plots")
    report.set_defaults(func=run_report)


def run_run(args: argparse.Namespace) -> int:
    extra = list(args.extra)
    if extra and extra[0] == "--":
        extra = extra[1:]
    options = RunOptions(**{f.name: getattr(args, f.name) for f in fields(RunOptions)
                            if f.name in vars(args) and f.name != "precisions"},
                         precisions=tuple(args.precisions or ()), extra_args=tuple(extra))
    model = options.model_path()
    out = args.out or Path("runs") / f"{model.stem}-{datetime.now():%Y%m%d-%H%M%S}"
    result = run_trtexec(options, out, trtexec=args.trtexec,
                         echo=None if args.quiet else sys.stderr, timeout_s=args.timeout)
    print(f"run folder: {result.out_dir}")
    print(f"artefacts: {', '.join(sorted(p.name for p in result.artefacts.values()))}")
    if result.missing:
        print(f"missing (trtexec did not write them): {', '.join(result.missing)}")
    if "times" in result.artefacts:
        s = summarize_times(load_times(result.artefacts["times"]), args.batch)
        gpu, lat = s["gpu_compute_ms"], s["latency_ms"]
        print(f"GPU compute ms: median {gpu['median']:.4g}, p99 {gpu['p99']:.4g}; latency ms: "
              f"median {lat['median']:.4g}, p99 {lat['p99']:.4g}; "
              f"{s['throughput']['qps']:.4g} qps")
    if args.report:
        report = write_report([result.out_dir], batch=args.batch)
        print(f"report: {report.out_dir / 'report.md'}")
    return 0


def run_parse(args: argparse.Namespace) -> int:
    count_types = [t.strip() for t in (args.count_types or "").split(",") if t.strip()]
    parsed = parse_path(args.path, batch=args.batch, top=max(args.top, 0),
                        count_types=count_types)
    if args.out:
        written = write_derived(args.path, args.out, args.batch)
        parsed["written"] = [str(p) for p in written]
    if args.json:
        sys.stdout.write(json.dumps(parsed, indent=2) + "\n")
    else:
        sys.stdout.write(render_text(parsed))
        for path in parsed.get("written", []):
            sys.stdout.write(f"wrote {path}\n")
    return 0


def run_report(args: argparse.Namespace) -> int:
    result = write_report([args.run_dir, *args.compare], args.out, batch=args.batch,
                          top_k=args.top, plots=args.plots)
    print(f"report: {result.out_dir / 'report.md'}")
    if result.report.get("plots_skipped"):
        print(f"plots skipped: {result.report['plots_skipped']}")
    else:
        print(f"plots: {', '.join(result.report['plots'])}")
    return 0
