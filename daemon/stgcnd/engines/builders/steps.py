"""The steps of a build that a current artefact never needs: the model's ONNX exported and
checked, calibration windows, the Q/DQ INT8 graph, the result validated.

The engine store reaches them through `build_steps()` (engines/builders/__init__.py) only
when something must be built: a daemon whose artefacts are current, or whose builds run in
the build process (engines/child_build.py), never loads the exporters or the quantizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stgcnd.engines.calibration import calibration_windows, refuse_without_calibration
from stgcnd.engines.quantize import quantize_qdq
from stgcnd.engines.validate import validate_backend, validate_export
from stgcnd.export.demo_onnx import demo_onnx_bytes
from stgcnd.export.onnx_export import ExportResult, export_model
from stgcnd.model.reference import export_module
from stgcnd.runtimes import importable

__all__ = ["calibration_windows", "export_onnx", "quantize_qdq", "refuse_without_calibration",
           "validate_backend"]


def export_onnx(model: Any, path: Path, dynamic_batch: bool, variant: str) -> ExportResult:
    """Export `model` (loaded) to `path`: the demo's graph from its numpy weights, any other
    model through torch. Without onnxruntime (a TensorRT-only Jetson) the export is checked
    by onnx only; the built engine is validated against PyTorch anyway."""
    check = None
    if importable("onnxruntime"):
        def check(data: bytes) -> dict[str, Any]:
            return validate_export(model, data, dynamic_batch)
    if model.spec.is_demo:
        return export_model(model, path, dynamic_batch=dynamic_batch, validate=check,
                            variant=variant, data=demo_onnx_bytes(model.spec, dynamic_batch))
    return export_model(model, path, dynamic_batch=dynamic_batch, validate=check,
                        module=export_module(model), variant=variant)
