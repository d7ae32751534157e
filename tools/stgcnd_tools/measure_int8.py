"""Measure INT8 Q/DQ accuracy on ONNX Runtime CPU against fp32 PyTorch (docs/engines.md).

Besides top-1 agreement it reports a "balanced" agreement (the fp32 logit difference centred
at its median), since the random-weight demo model agrees trivially.
`python -m stgcnd_tools.measure_int8 --help` lists the options.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from stgcnd.engines.quantize import quantize_qdq
from stgcnd.engines.validate import compare_logits
from stgcnd.export.onnx_export import export_model
from stgcnd.log import configure_logging
from stgcnd.model.reference import export_module, load_for_inference, reference_logits
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.runtimes.onnxruntime_runtime import ort_session


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stgcnd_tools.measure_int8")
    p.add_argument("--frames", type=int, default=150)
    p.add_argument("--calibration", type=int, default=256)
    p.add_argument("--windows", type=int, default=400)
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--method", default="minmax", choices=["minmax", "entropy", "percentile"])
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    configure_logging("warning", "console")
    spec = ModelSpec(checkpoint=args.checkpoint, frames=args.frames)
    model = load_for_inference(spec)
    calib = synthetic_windows(args.calibration, spec.frames, spec.persons, spec.num_node, seed=1)
    evals = synthetic_windows(args.windows, spec.frames, spec.persons, spec.num_node, seed=2)
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "model.onnx"
        export_model(model, fp32, dynamic_batch=True, module=export_module(model))
        int8 = Path(tmp) / "model.int8.onnx"
        t0 = time.perf_counter()
        quantize_qdq(fp32, int8, calib, dynamic_batch=True, method=args.method)
        quant_s = time.perf_counter() - t0
        sess = ort_session(int8)
        got = np.concatenate([sess.run(None, {"input": evals[i:i + 16]})[0]
                              for i in range(0, len(evals), 16)])
    ref = reference_logits(model, evals)
    result = {"frames": spec.frames, "calibration_windows": args.calibration,
              "windows": args.windows, "method": args.method, "demo": spec.is_demo,
              "quantize_seconds": round(quant_s, 1), **compare_logits(ref, got),
              "logit_abs_max": float(np.abs(ref).max()),
              "fp32_classes": np.bincount(ref.argmax(1), minlength=ref.shape[1]).tolist()}
    if ref.shape[1] == 2:
        d_ref, d_got = ref[:, 1] - ref[:, 0], got[:, 1] - got[:, 0]
        centre = float(np.median(d_ref))
        result.update(
            top1_agreement_balanced=float(np.mean((d_ref > centre) == (d_got > centre))),
            logit_margin_std=float(d_ref.std()),
            margin_error_std=float((d_got - d_ref).std()))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
