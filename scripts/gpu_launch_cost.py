"""Host CPU a GPU batch costs the thread that drives it (the I/O loop, with dispatch "loop").

    python3 scripts/gpu_launch_cost.py [N]

Builds the demo model's torch runner as the daemon does (fp16, CUDA graphs, buckets 1 and 8,
with 64 client lanes and without), attaches it to this thread as the I/O loop does, and
times with the thread's own CPU clock, per batch: `launch` (staging, uploads, events, graph
launch, downloads), one `done` query of a finished batch, and `collect` (compute time and the
logits' copy). The batch is waited for between the phases (not counted). Prints one line per
configuration: median and 90th percentile, in microseconds.

Run it with another tree first on PYTHONPATH to compare two versions of the runner on the
same machine in the same call (docs/benchmarks.md).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np


def measure(runner: Any, windows: list, lanes: list, n: int) -> dict:
    launch, done, collect = [], [], []
    clock = time.thread_time_ns
    for i in range(n + 20):
        t0 = clock()
        runner.launch(windows, lanes)
        t1 = clock()
        runner.wait()
        t2 = clock()
        runner.done()
        t3 = clock()
        runner.collect()
        t4 = clock()
        if i >= 20:  # the first ones pay lazy set-up
            launch.append(t1 - t0)
            done.append(t3 - t2)
            collect.append(t4 - t3)
    return {k: np.array(v) / 1e3 for k, v in
            (("launch", launch), ("done", done), ("collect", collect))}


def main() -> int:
    import torch

    from stgcnd.backends.torch_backend import TorchBackend
    from stgcnd.model.loader import load_model
    from stgcnd.model.spec import ModelSpec
    from stgcnd.model.synthetic import synthetic_windows

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    model = load_model(ModelSpec())
    spec = model.spec
    x = synthetic_windows(8, spec.frames, spec.persons, spec.num_node, seed=1)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {n} batches each")
    with TorchBackend(model, "fp16", "cuda", cuda_graph=True, max_batch=8) as backend:
        for lanes in (64, 0):
            runner = backend.open_runner((1, 8), lanes=lanes)
            try:
                runner.warm_up(2)
                runner.attach()
                raw = bool(getattr(runner, "graph_execs", None))
                for b in (1, 8):
                    windows = list(x[:b])
                    ids = [(7 * i) % lanes if lanes else 0 for i in range(b)]
                    r = measure(runner, windows, ids, n)
                    cells = "  ".join(f"{k} {np.median(v):6.1f} / {np.percentile(v, 90):6.1f}"
                                      for k, v in r.items())
                    total = sum(np.median(v) for v in r.values())
                    print(f"lanes {lanes:2d} batch {b}: {cells}  sum {total:6.1f} us"
                          f"{'  (raw graph launch)' if raw else ''}")
            finally:
                runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
