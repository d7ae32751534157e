"""PyTorch: nothing to write but the manifest.

The torch backend folds BatchNorm from the loaded checkpoint at start (milliseconds), so a
stored copy of folded weights would only be a second source of truth. The manifest still
records the key and the validation result, so `stgcnd engines list` shows what was checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stgcnd.engines.builders.base import BuildContext, Builder
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
        return {"graph": "bn-folded at load"}

    def open(self, artifact: Any, options: BuildOptions, model: Any, cache: Path) -> Runtime:
        o = options
        return runtime_module("torch").TorchRuntime(
            model, o.precision, o.device, cuda_graph=o.cuda_graph, max_batch=o.max_batch,
            threads=o.threads, compile_mode=o.compile, compile_cache=cache)
