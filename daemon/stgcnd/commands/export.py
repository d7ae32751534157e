"""`stgcnd export`: checkpoint -> validated ONNX model with a JSON sidecar."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from stgcnd.commands._model_args import add_model_arguments, spec_from_args
from stgcnd.engines.validate import validate_export
from stgcnd.export.onnx_export import export_model
from stgcnd.model.reference import export_module, load_for_inference


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a checkpoint to a validated ONNX model",
                       description="Export an st-gcn checkpoint (or the demo model) to ONNX "
                                   "(opset 17), check it with onnx.checker and validate it "
                                   "against PyTorch with ONNX Runtime.")
    add_model_arguments(p)
    p.add_argument("--output", "-o", type=Path, required=True, help="output .onnx path")
    # Dynamic by default: the daemon batches cameras (max_batch 8 on a Jetson, 16 on a CPU),
    # and a board without torch refuses a batch-1 export for such a configuration.
    batch = p.add_mutually_exclusive_group()
    batch.add_argument("--dynamic-batch", action="store_true",
                       help="a dynamic batch dimension N, what the daemon batches with "
                            "(the default; kept for older command lines)")
    batch.add_argument("--static-batch", action="store_true",
                       help="a batch of 1, only for a configuration with max_batch = 1 and "
                            "instances = 1")
    p.add_argument("--optimized", action="store_true",
                   help="export the inference-optimized graph (BatchNorm folded)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="max abs difference allowed against PyTorch (default: 1e-4)")
    p.add_argument("--skip-validation", action="store_true",
                   help="do not run ONNX Runtime against PyTorch (not recommended)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = load_for_inference(spec_from_args(args))
    dynamic = not args.static_batch
    module, variant = (export_module(model), "optimized") if args.optimized else (None, "plain")

    def check(data: bytes) -> dict[str, Any]:
        return validate_export(model, data, dynamic, tolerance=args.tolerance)

    res = export_model(model, args.output, dynamic_batch=dynamic,
                       validate=None if args.skip_validation else check,
                       module=module, variant=variant)
    for note in model.notes:
        print(f"note: {note}")
    v = res.validation
    check_text = ("not validated (--skip-validation)" if v is None
                  else f"validated with ONNX Runtime: max abs diff {v['max_abs_diff']:.2e} "
                       f"<= {args.tolerance:g}")
    print(f"wrote {res.onnx_path} (sha256 {res.onnx_sha256[:12]}, batch "
          f"{'dynamic' if dynamic else '1'}), {check_text}")
    print(f"sidecar: {res.sidecar_path}")
    spec = model.spec
    print(f"motion stream: {spec.motion} (the original st-gcn two-stream model uses "
          "second-difference; --motion must match how the checkpoint was trained)")
    return 0
