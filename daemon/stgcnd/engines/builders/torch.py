"""PyTorch: nothing to write but the manifest.

The torch backend folds BatchNorm from the loaded checkpoint at start (milliseconds), so a
stored copy of folded weights would only be a second source of truth. The manifest records
the key, the validation result and, with `compile = "max-autotune"`, each bucket's trial.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stgcnd.engines.builders.base import BuildContext, Builder
from stgcnd.engines.builders.torch_autotune import TUNED, try_buckets, tuned_buckets
from stgcnd.engines.options import BuildOptions
from stgcnd.errors import BackendUnavailable, UserError
from stgcnd.runtimes import runtime_module
from stgcnd.runtimes.base import Runtime
from stgcnd.versions import module_version, torch_missing, torch_unusable


class TorchBuilder(Builder):
    name = "torch"
    suffix = None

    def version(self) -> str | None:
        v = module_version("torch")
        if v is None:
            raise BackendUnavailable(torch_missing("building for the torch runtime"))
        too_old = torch_unusable(v)
        if too_old:
            raise BackendUnavailable(too_old)
        return v

    def check(self, options: BuildOptions) -> None:
        if options.precision == "int8":
            raise UserError("the torch backend runs fp32 or fp16; for int8 use --backend "
                            "onnxruntime (CPU) or tensorrt (GPU)")

    def needs_qdq(self, options: BuildOptions) -> bool:
        return False

    def build(self, ctx: BuildContext, out: Path) -> dict[str, Any]:
        o = ctx.options
        if o.compile != TUNED or o.device != "cuda" or not o.cuda_graph:
            return {"graph": "bn-folded at load"}
        # The autotuned kernels are tried now, each bucket where a fault cannot end the
        # daemon's CUDA context; open() serves those that passed.
        return {"graph": "bn-folded at load",
                "autotune": try_buckets(ctx.model.spec.to_dict(), o.precision, o.buckets,
                                        ctx.store_root)}

    def open(self, artifact: Any, options: BuildOptions, model: Any, cache: Path) -> Runtime:
        o = options
        tuned = tuned_buckets(artifact.manifest) if o.compile == TUNED else None
        return runtime_module("torch").TorchRuntime(
            model, o.precision, o.device, cuda_graph=o.cuda_graph, max_batch=o.max_batch,
            threads=o.threads, compile_mode=o.compile, compile_cache=cache,
            tuned_batches=tuned, dynamic_kernels=o.dynamic_kernels)
