"""One peer row of the bench in its own process (`stgcnd_tools.bench.peer`): the fused module
as the daemon builds it, compiled the way a user writes it, timed host array to host logits.

    python -m stgcnd_tools.bench.peer_child JOB.json
"""

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

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    device, dtype = torch.device(job["device"]), _DTYPES[job["precision"]]
    if device.type == "cuda":  # the math of the torch runtime's rows (TorchRuntime.__init__)
        torch.backends.cudnn.benchmark = True
        if job["precision"] == "fp32":
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
    model = load_model(ModelSpec(**job["spec"]))
    module = optimize(model.module).to(device, dtype).eval()  # the daemon's fused module
    for p in module.parameters():
        p.requires_grad_(False)
    fn = module if job["mode"] is None else torch.compile(
        module, mode=job["mode"], dynamic=False)
    x = np.load(job["windows"])
    windows, batch = list(x), np.empty_like(x)

    def call() -> np.ndarray:
        # As every bench row is called: a list of windows into one host batch, logits back.
        for i, w in enumerate(windows):
            np.copyto(batch[i], w)
        with torch.inference_mode():
            return fn(torch.from_numpy(batch).to(device).to(dtype)).float().cpu().numpy()

    t0 = time.perf_counter()
    out = call()
    first_call_s = time.perf_counter() - t0
    for _ in range(int(job["warmup"])):
        call()
    times = []
    for _ in range(int(job["iterations"])):
        t0 = time.perf_counter()
        out = call()
        times.append((time.perf_counter() - t0) * 1e3)
    np.savez(job["result"], times_ms=np.array(times), logits=out,
             first_call_s=np.array(first_call_s))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
