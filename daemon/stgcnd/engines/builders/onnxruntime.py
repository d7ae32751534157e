"""ONNX Runtime artefacts: the graph-optimized fp32 model, or the Q/DQ INT8 model.

fp32: extended graph optimizations applied once and saved, not redone at every start. int8: on
the CPU the CPU recipe (engines/quantize.py) from the calibration windows; with the CUDA
provider, the TensorRT recipe's model that the store shares between backends.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from stgcnd.engines.builders.base import BuildContext, Builder
from stgcnd.engines.options import BuildOptions
from stgcnd.errors import UserError
from stgcnd.runtimes import import_onnxruntime, runtime_module
from stgcnd.runtimes.base import Runtime


def _probe_space(path: Path, nbytes: int) -> None:
    """Raise the OSError (ENOSPC, EFBIG, EACCES...) that writing `nbytes` to `path` meets."""

    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, max(1, nbytes))
    finally:
        os.close(fd)


class OnnxRuntimeBuilder(Builder):
    name = "onnxruntime"
    suffix = ".onnx"

    def version(self) -> str | None:
        return str(import_onnxruntime().__version__)

    def check(self, options: BuildOptions) -> None:
        if options.precision in ("fp16", "bf16"):
            # Reached from the command line (`build`, `validate`) and, through the
            # store, from `build --config`: name both spellings of the fix.
            raise UserError(f"the onnxruntime backend builds fp32 or int8 (Q/DQ); for "
                            f"{options.precision} use the torch backend (bf16: on a CPU with "
                            "AVX512-BF16 or AMX) or tensorrt (fp16): --backend on the command "
                            "line, backend = \"...\" in a configuration")
        runtime_module("onnxruntime").providers(options.device)  # CUDA's missing: unavailable

    def _providers(self, options: BuildOptions) -> list[str]:
        return list(runtime_module("onnxruntime").provider_names(options.device))

    def needs_qdq(self, options: BuildOptions) -> bool:
        """The TensorRT recipe's shared model only for the CUDA provider; the CPU recipe is
        made by build()."""
        return options.precision == "int8" and options.device == "cuda"

    def build(self, ctx: BuildContext, out: Path) -> dict[str, Any]:
        if ctx.options.precision == "int8" and ctx.options.device == "cpu":
            assert ctx.calibration is not None
            # Here, not at the top: the daemon loads this builder to check a stored
            # artefact's key, and quantizes nothing then.
            from stgcnd.engines.quantize import quantize_for_cpu

            q = quantize_for_cpu(ctx.onnx_path, out, ctx.calibration, ctx.options.dynamic_batch)
            return {"graph": "qdq-int8-cpu", "quantization": q,
                    "providers": self._providers(ctx.options)}
        if ctx.options.precision == "int8":
            assert ctx.qdq_onnx_path is not None
            shutil.copyfile(ctx.qdq_onnx_path, out)
            return {"graph": "qdq-int8", "providers": self._providers(ctx.options)}
        try:
            runtime_module("onnxruntime").ort_session(
                ctx.onnx_path, ctx.options.device, ctx.options.threads, optimized_to=out)
        except Exception as exc:
            # ORT reports a full disk as "Protobuf serialization failed": find the real cause.
            _probe_space(out, ctx.onnx_path.stat().st_size)
            raise RuntimeError(f"onnxruntime could not optimize {ctx.onnx_path}: {exc}") from exc
        if not out.exists() or out.stat().st_size == 0:
            raise OSError(f"onnxruntime wrote no optimized model to {out}")
        return {"graph": "ort-extended", "providers": self._providers(ctx.options)}

    def open(self, artifact: Any, options: BuildOptions, model: Any, cache: Path) -> Runtime:
        m = artifact.manifest
        path = artifact.path if artifact.path is not None else artifact.onnx_path
        return runtime_module("onnxruntime").OnnxRuntimeRuntime(
            path, tuple(m["input_shape"]), int(m["num_class"]), int(m.get("max_batch", 1)),
            artifact.precision, options.threads, options.device)
