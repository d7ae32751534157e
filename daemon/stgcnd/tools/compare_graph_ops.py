"""Measure the graph step written as Einsum vs MatMul in the exported ONNX, on ONNX Runtime.

    python -m stgcnd.tools.compare_graph_ops [--persons 1] [--frames 150] [--runs 30]

Prints the median batch-1 latency of each form on this machine's CPU (or --provider).
The choice of the default graph op (matmul) rests on this measurement; see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from stgcnd.engines.validate import ort_session
from stgcnd.export.onnx_export import export_model
from stgcnd.log import configure_logging
from stgcnd.model.reference import load_for_inference
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--persons", type=int, default=1)
    p.add_argument("--frames", type=int, default=150)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()


    configure_logging("warning")
    x = synthetic_windows(1, args.frames, args.persons, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        for op in ("einsum", "matmul"):
            model = load_for_inference(ModelSpec(persons=args.persons, frames=args.frames,
                                                 graph_op=op))
            res = export_model(model, Path(tmp) / f"{op}.onnx")
            sess = ort_session(res.onnx_path, threads=args.threads)
            for _ in range(3):
                sess.run(None, {"input": x})
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                sess.run(None, {"input": x})
                times.append((time.perf_counter() - t0) * 1e3)
            print(f"{op:7s} median {statistics.median(times):8.2f} ms  "
                  f"p90 {np.percentile(times, 90):8.2f} ms  (M={args.persons}, T={args.frames}, "
                  f"batch 1, {args.runs} runs)")


if __name__ == "__main__":
    main()
