"""A peer row of the bench (bench/runner.py, #35) in its own process: the fused module as the
daemon builds it, compiled as a user writes it, timed host windows to host logits."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from stgcnd.model.loader import load_model
from stgcnd.model.optimized import optimize
from stgcnd.model.spec import ModelSpec


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    device, precision = torch.device(job["device"]), job["precision"]
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    if device.type == "cuda":  # the torch runtime's math (TorchRuntime.__init__)
        torch.backends.cudnn.benchmark = True
        if precision == "fp32":
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    module = optimize(load_model(ModelSpec(**job["spec"])).module).to(device, dtype).eval()
    fn = module if job["mode"] is None else torch.compile(module, mode=job["mode"],
                                                          dynamic=False)
    x = np.load(f"{job['dir']}/x.npy")
    windows, batch, times = list(x), np.empty_like(x), []
    for _ in range(1 + job["warmup"] + job["iterations"]):  # the first call compiles
        t0 = time.perf_counter()
        for i, w in enumerate(windows):  # as every bench row is called: windows in, logits out
            np.copyto(batch[i], w)
        with torch.inference_mode():
            out = fn(torch.from_numpy(batch).to(device).to(dtype)).float().cpu().numpy()
        times.append((time.perf_counter() - t0) * 1e3)
    np.savez(f"{job['dir']}/result.npz", times_ms=np.array(times[1 + job["warmup"]:]),
             logits=out, first_call_s=np.array(times[0] / 1e3))


if __name__ == "__main__":
    main(sys.argv[1])
