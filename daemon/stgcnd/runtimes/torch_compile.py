"""torch.compile for the torch runtime on CUDA: inductor's fused Triton kernels inside the
runner's own CUDA graphs (the modes, the cache and why not on the CPU: above `unavailable`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Callable

import torch

from stgcnd.versions import module_version

MODES = ("auto", "off", "reduce-overhead", "max-autotune")
# Inductor's kernels only: our runner captures the graphs around them.
_INDUCTOR_MODE = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
# Every bucket is a static shape of each stream of every model served: well above dynamo's
# default of 8 recompilations of one function before it falls back to eager.
_RECOMPILE_LIMIT = 1024


# Modes (config key `compile`):
# - "reduce-overhead": inductor's default kernels (seconds to compile a bucket);
# - "off": the uncompiled module;
# - "auto": "reduce-overhead" where Triton is installed, else "off";
# - "max-autotune": inductor benchmarks kernel choices (minutes a bucket, once: cached). Each
#   bucket is tried in a process of its own before it serves, since a faulting kernel ends its
#   process's CUDA context (engines/builders/torch_autotune.py); the runtime is told which
#   batch sizes passed (`tuned_batches`), the others run the default kernels.
# Inductor's compiled graphs and autotuning results are cached on disk (its FX graph and
# autotune caches) under the engine store, per torch and Triton version and device, so that a
# second start compiles from cache. On the CPU torch.compile is refused: against the
# uncompiled fused module it was barely faster at batch 1 and slower at batch 8, after a long
# compile (docs/performance.md).
def unavailable(device: torch.device) -> str | None:
    """Why torch.compile cannot serve on `device`, or None."""
    if device.type != "cuda":
        return ("torch.compile is for CUDA devices (on a CPU it was measured not to pay: "
                "see runtimes/torch_compile.py)")
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile (torch 2.0 or newer has)"
    if importlib.util.find_spec("triton") is None:
        return ("Triton is not installed (inductor's GPU kernels need it; CUDA wheels of torch "
                "on x86-64 bring it, JetPack's torch does not)")
    return None


def resolve(mode: str, device: torch.device) -> tuple[str, str | None]:
    """(the mode that will run, why another was asked for but cannot run, or None)."""
    if mode not in MODES:
        raise ValueError(f"compile must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "off":
        return "off", None
    why_not = unavailable(device)
    if why_not is not None:
        return "off", why_not
    return ("reduce-overhead" if mode == "auto" else mode), None


def use_cache(root: Path, device: torch.device) -> Path:
    """Point inductor's on-disk caches at `root`/<torch, Triton, device> unless the user set
    TORCHINDUCTOR_CACHE_DIR; returns the directory in use. Process-wide, like the caches."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    name = torch.cuda.get_device_name(device)
    cc = "".join(map(str, torch.cuda.get_device_capability(device)))
    key = re.sub(r"[^A-Za-z0-9.+-]+", "_", f"torch{torch.__version__}-triton"
                 f"{module_version('triton')}-{name}-sm{cc}")
    path = root / "torch-compile" / key
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return path


def marks_dynamic() -> bool:
    """Whether kernels dynamic in the batch can be asked for: torch 2.0 has no mark_dynamic
    (there every bucket compiles static kernels of its own)."""
    return hasattr(importlib.import_module("torch._dynamo"), "mark_dynamic")


def compiled(module: torch.nn.Module, mode: str, static: bool, dynamic_batch: bool = False
             ) -> Callable[[torch.Tensor], torch.Tensor]:
    """`module` compiled lazily: each new batch shape compiles at its first call (`static`),
    or the second shape makes the kernels dynamic in the batch. `dynamic_batch`: kernels
    dynamic in the batch from the first batch above 1 on, so that ten buckets cost two or
    three compiles instead of ten (batch 1 torch always specializes; a kernel choice that
    depends on the batch may add a range: dynamo's guards say which)."""
    # A submodule `import torch` leaves out (seconds); imported only when compiling.
    config = importlib.import_module("torch._dynamo.config")
    for limit in ("cache_size_limit", "recompile_limit"):  # renamed in torch 2.6
        if hasattr(config, limit):
            setattr(config, limit, max(getattr(config, limit), _RECOMPILE_LIMIT))
    dynamic_batch = dynamic_batch and marks_dynamic()
    fn: Callable[[torch.Tensor], torch.Tensor] = torch.compile(
        module, mode=_INDUCTOR_MODE[mode],
        dynamic=False if static and not dynamic_batch else None)
    if not dynamic_batch:
        return fn
    mark = importlib.import_module("torch._dynamo").mark_dynamic

    def batch_dynamic(x: torch.Tensor) -> torch.Tensor:
        # Marked at every call: a mark is an attribute of this tensor object, and a new
        # shape's compile reads it (a guarded call that compiles nothing does not).
        if x.shape[0] > 1:
            mark(x, 0)
        return fn(x)
    return batch_dynamic
