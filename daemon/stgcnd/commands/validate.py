"""`stgcnd validate`: is this engine good enough? Compared with fp32 PyTorch on your windows."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.commands._model_args import add_model_arguments, require_files, spec_from_args
from stgcnd.commands.build import add_build_arguments, options_from_args, store_from_args
from stgcnd.engines.calibration import load_windows
from stgcnd.engines.validate import validate_backend
from stgcnd.fsutil import atomic_write_json
from stgcnd.model.reference import load_for_inference
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.provision import first_that_serves

# Defaults per precision when --max-abs-diff / --min-top1 are not given. Logit differences
# depend on the model's logit scale, so only fp32 gets an absolute bound by default; reduced
# precisions are judged by what a classifier's user sees: the same predicted class.
DEFAULT_THRESHOLDS: dict[str, dict[str, float | None]] = {
    "fp32": {"max_abs_diff": 1e-3, "min_top1": 1.0},
    "fp16": {"max_abs_diff": None, "min_top1": 0.99},
    "int8": {"max_abs_diff": None, "min_top1": 0.99},
}
SYNTHETIC_WINDOWS = 64


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="compare an engine with the fp32 PyTorch reference",
                       description="Build or reuse the engine, run it and the fp32 PyTorch "
                                   "model on the same windows, report max/mean abs logit "
                                   "difference and top-1 agreement; exit 3 beyond thresholds.")
    add_model_arguments(p)
    add_build_arguments(p)
    p.add_argument("--windows", type=Path, default=None,
                   help=".npz/.npy windows (N, 3, T, V, M); every matching array of an .npz "
                        f"is used (default: {SYNTHETIC_WINDOWS} generated skeleton windows)")
    p.add_argument("--count", type=int, default=SYNTHETIC_WINDOWS,
                   help="number of generated windows when --windows is not given "
                        "(default: %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="write the result as JSON here")
    p.add_argument("--max-abs-diff", type=float, default=None,
                   help="fail above this max |logit difference| (default: 1e-3 for fp32, "
                        "not checked for fp16/int8)")
    p.add_argument("--min-top1", type=float, default=None,
                   help="fail below this top-1 agreement (default: 1.0 for fp32, 0.99 for "
                        "fp16/int8)")
    p.set_defaults(func=run)


def check_thresholds(result: dict[str, Any], max_abs: float | None, min_top1: float | None
                     ) -> list[str]:
    failures = []
    if max_abs is not None and not result["max_abs_diff"] <= max_abs:
        failures.append(f"max abs diff {result['max_abs_diff']:.3g} > {max_abs:g}")
    if min_top1 is not None and not result["top1_agreement"] >= min_top1:
        failures.append(f"top-1 agreement {result['top1_agreement']:.2%} < {min_top1:.2%}")
    return failures


def run(args: argparse.Namespace) -> int:
    require_files(windows=args.windows, calibration=args.calibration)
    spec = spec_from_args(args)
    model = load_for_inference(spec)
    store = store_from_args(args)
    if args.windows is not None:
        windows = load_windows(args.windows, spec.input_shape)
        source = str(args.windows)
    else:
        windows = synthetic_windows(args.count, spec.frames, spec.persons, spec.num_node,
                                    seed=7)
        source = f"synthetic ({args.count} generated skeleton windows)"
    # The runtime `serve` would serve (auto: the first of its chain that loads).
    runtime, choice = first_that_serves(model, args.backend, options_from_args(args), store,
                                        lambda c: c.load(model, store))
    options = choice.options
    try:
        result = validate_backend(model, runtime, np.ascontiguousarray(windows))
        info = runtime.info
    finally:
        runtime.close()
    defaults = DEFAULT_THRESHOLDS[options.precision]
    max_abs = args.max_abs_diff if args.max_abs_diff is not None else defaults["max_abs_diff"]
    min_top1 = args.min_top1 if args.min_top1 is not None else defaults["min_top1"]
    failures = check_thresholds(result, max_abs, min_top1)
    report = {**result, "windows_source": source, "artifact": info.artifact,
              "thresholds": {"max_abs_diff": max_abs, "min_top1": min_top1},
              "passed": not failures, "failures": failures,
              "model": spec.to_dict(), "demo": spec.is_demo}
    if args.json:
        atomic_write_json(args.json, report)
    for note in model.notes:
        print(f"note: {note}")
    print(f"{info.name} {info.precision} on {info.device} vs fp32 PyTorch, {result['windows']} "
          f"windows from {source}:")
    print(f"  max abs diff {result['max_abs_diff']:.4g}, mean abs diff "
          f"{result['mean_abs_diff']:.4g}, top-1 agreement {result['top1_agreement']:.2%}")
    if "margin_change_max" in result:
        print(f"  top-two logit margin moved by {result['margin_change_median']:.3g} (median) "
              f"/ {result['margin_change_max']:.3g} (max): what a score threshold sees")
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 3
    print("passed")
    return 0
