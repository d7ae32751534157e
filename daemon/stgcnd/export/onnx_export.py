"""PyTorch -> ONNX, checked with onnx.checker and validated against PyTorch with ONNX Runtime.

The graph: input `input` float32 (N, 3, T, V, M), output `output` logits (N, num_class), opset
17, static shapes unless dynamic batch is asked for. The sidecar JSON beside the ONNX file says
what it was made from, so the engine store can tell when it is stale.
"""

from __future__ import annotations

import inspect
import io
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stgcnd.errors import UserError, ValidationError
from stgcnd.fsutil import atomic_write_bytes, atomic_write_json
from stgcnd.log import get_logger
from stgcnd.model.reference import reference_logits
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.runtimes import import_onnxruntime
from stgcnd.versions import tool_versions

if TYPE_CHECKING:  # torch is optional: only the export of a PyTorch network imports it
    import torch

    from stgcnd.model import LoadedModel

log = get_logger(__name__)

OPSET = 17
INPUT_NAME = "input"
OUTPUT_NAME = "output"
DEFAULT_TOLERANCE = 1e-4


@dataclass
class ExportResult:
    onnx_path: Path
    sidecar_path: Path
    onnx_sha256: str
    max_abs_diff: float | None
    sidecar: dict[str, Any]


def sidecar_path(onnx_path: Path) -> Path:
    return onnx_path.with_name(onnx_path.name + ".json")


def onnx_bytes(model: LoadedModel, module: torch.nn.Module | None = None,
               dynamic_batch: bool = False, opset: int = OPSET) -> bytes:
    """Serialised ONNX of `module` (default: the model's own network) for one batch of windows."""
    import torch

    module = module if module is not None else model.module
    example = torch.zeros((1, *model.spec.input_shape), dtype=torch.float32)
    buf = io.BytesIO()
    dynamic_axes = {INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}} if dynamic_batch else None
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (example,), buf, opset_version=opset,
                          input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_axes=dynamic_axes, do_constant_folding=True,
                          **torchscript_exporter(torch.onnx.export))
    return buf.getvalue()


def torchscript_exporter(export: Any) -> dict[str, Any]:
    """The keyword that picks the TorchScript exporter, where this torch has a choice.

    That exporter is deterministic, needs no onnxscript, and suits this static-control-flow
    network. torch 2.5+ takes `dynamo=` (and newer releases default it to True); JetPack 5's
    torch 2.0/2.1 has no such keyword and always uses TorchScript: passing it there raised
    TypeError on the first export."""
    try:
        params = inspect.signature(export).parameters
    except (TypeError, ValueError):  # a builtin without a signature: assume the old API
        return {}
    return {"dynamo": False} if "dynamo" in params else {}


def check_onnx(data: bytes) -> None:
    import onnx

    proto = onnx.load_from_string(data)
    onnx.checker.check_model(proto, full_check=True)


def ort_session(path_or_bytes: Path | bytes, threads: int = 0) -> Any:
    ort = import_onnxruntime()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    src = str(path_or_bytes) if isinstance(path_or_bytes, Path) else path_or_bytes
    return ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])


def validate_with_ort(model: LoadedModel, onnx_data: bytes, dynamic_batch: bool,
                      windows: np.ndarray | None = None, tolerance: float = DEFAULT_TOLERANCE
                      ) -> float:
    """Max |ONNX Runtime - PyTorch| over the windows; raises ValidationError beyond tolerance."""
    spec = model.spec
    if windows is None:
        # Realistic skeletons plus a window with empty person slots and one of uniform noise.
        windows = np.concatenate([
            synthetic_windows(3, spec.frames, spec.persons, spec.num_node, seed=1),
            synthetic_windows(1, spec.frames, spec.persons, spec.num_node, present=1, seed=2),
            np.random.default_rng(3).random((1, *spec.input_shape), dtype=np.float32),
        ])
    ref = reference_logits(model, windows)
    sess = ort_session(onnx_data)
    if dynamic_batch:
        got = sess.run([OUTPUT_NAME], {INPUT_NAME: windows})[0]
    else:
        got = np.concatenate([sess.run([OUTPUT_NAME], {INPUT_NAME: w[None]})[0] for w in windows])
    diff = float(np.max(np.abs(got - ref)))
    if not np.isfinite(diff) or diff > tolerance:
        raise ValidationError(
            f"ONNX Runtime output differs from the reference by {diff:.3g} (> {tolerance:g}) on "
            f"{len(windows)} windows; the exported graph is not the same function. Report this "
            "with `stgcnd doctor` output; try --graph-op einsum.")
    return diff


def export_model(model: LoadedModel, output: Path, dynamic_batch: bool = False,
                 validate: bool = True, tolerance: float = DEFAULT_TOLERANCE,
                 module: torch.nn.Module | None = None, variant: str = "plain",
                 data: bytes | None = None) -> ExportResult:
    """Export, check, validate, then write the ONNX file and its sidecar atomically.

    `data`: an ONNX graph built elsewhere (the demo model's, from numpy: no torch needed) to
    check, validate against the model's reference and write the same way.
    """
    import hashlib

    output = Path(output)
    if output.suffix != ".onnx":
        raise UserError(f"--output must end in .onnx, got {output}")
    t0 = time.perf_counter()
    if data is None and module is None and getattr(model, "module", None) is None:
        # The demo model without torch (stgcnd.model.numpy_demo): its graph is built from numpy.
        from stgcnd.export.demo_onnx import VARIANT, demo_onnx_bytes

        data, variant = demo_onnx_bytes(model.spec, dynamic_batch), VARIANT
    if data is None:
        data = onnx_bytes(model, module, dynamic_batch)
    try:
        check_onnx(data)
    except Exception as exc:  # the checker's own exception types differ across onnx releases
        raise ValidationError(f"onnx.checker rejected the exported graph: {exc}") from None
    diff = validate_with_ort(model, data, dynamic_batch, tolerance=tolerance) if validate else None
    sha = hashlib.sha256(data).hexdigest()
    spec = model.spec
    sidecar = {
        "format": "stgcnd-onnx/1",
        "onnx_sha256": sha,
        "checkpoint": str(spec.checkpoint) if spec.checkpoint else None,
        "checkpoint_sha256": model.checkpoint_sha256,
        "demo": spec.is_demo,
        "input": {"name": INPUT_NAME, "dtype": "float32",
                  "shape": ["N" if dynamic_batch else 1, *spec.input_shape]},
        "output": {"name": OUTPUT_NAME, "dtype": "float32",
                   "shape": ["N" if dynamic_batch else 1, model.num_class]},
        "dynamic_batch": dynamic_batch,
        "layout": spec.layout,
        "persons": spec.persons,
        "frames": spec.frames,
        "motion": spec.motion,
        "graph_op": spec.graph_op,
        "variant": variant,
        "num_class": model.num_class,
        "labels": list(model.labels),
        "adjacency_fingerprint": model.adjacency_fingerprint,
        "architecture": model.describe(),
        "opset": OPSET,
        "validation": None if diff is None else {
            "runtime": "onnxruntime-cpu", "max_abs_diff": diff, "tolerance": tolerance},
        "versions": tool_versions("onnxruntime"),
        "export_seconds": round(time.perf_counter() - t0, 3),
    }
    atomic_write_bytes(output, data)
    atomic_write_json(sidecar_path(output), sidecar)
    log.info("onnx_exported", path=str(output), sha256=sha, max_abs_diff=diff,
             dynamic_batch=dynamic_batch, variant=variant)
    return ExportResult(output, sidecar_path(output), sha, diff, sidecar)
