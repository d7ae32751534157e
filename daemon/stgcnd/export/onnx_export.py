"""PyTorch -> ONNX, checked with onnx.checker, and validated by whatever the caller passes.

The export knows no runtime (the store passes its ONNX Runtime check in). Input `input`
float32 (N, 3, T, V, M), output `output` logits, opset 17; a JSON sidecar says what it was
made from, so the store can tell when it is stale.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stgcnd.errors import UserError, ValidationError
from stgcnd.export import INPUT_NAME, OPSET, OUTPUT_NAME
from stgcnd.fsutil import atomic_write_bytes, atomic_write_json
from stgcnd.log import get_logger
from stgcnd.versions import tool_versions

if TYPE_CHECKING:  # torch is optional: only the export of a PyTorch network imports it
    import torch

    from stgcnd.model.loader import LoadedModel

log = get_logger(__name__)



@dataclass
class ExportResult:
    onnx_path: Path
    sidecar_path: Path
    onnx_sha256: str
    validation: dict[str, Any] | None
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
        # torch types `f` as a path only; its TorchScript exporter (all that torch 2.0/2.1 has)
        # writes to a file object too.
        torch.onnx.export(module, (example,), buf, opset_version=opset,  # type: ignore[arg-type]
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


def export_model(model: LoadedModel, output: Path, dynamic_batch: bool = False,
                 validate: Callable[[bytes], dict[str, Any]] | None = None,
                 module: torch.nn.Module | None = None, variant: str = "plain",
                 data: bytes | None = None) -> ExportResult:
    """Export, check, validate, then write the ONNX file and its sidecar atomically.

    `validate(onnx bytes)`: raises if the graph does not compute the model's function, else
    returns what to record in the sidecar (e.g. the largest difference from the reference).
    `data`: an ONNX graph built elsewhere (the demo model's, from numpy: no torch needed) to
    check, validate and write the same way.
    """

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
    validation = validate(data) if validate is not None else None
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
        "validation": validation,
        "versions": tool_versions(),
        "export_seconds": round(time.perf_counter() - t0, 3),
    }
    atomic_write_bytes(output, data)
    atomic_write_json(sidecar_path(output), sidecar)
    log.info("onnx_exported", path=str(output), sha256=sha, dynamic_batch=dynamic_batch,
             variant=variant, validation=validation)
    return ExportResult(output, sidecar_path(output), sha, validation, sidecar)


def output_classes(path: Path) -> int | None:
    """The class count an ONNX file's graph itself has (its logits output's last dimension),
    read without its weights; None where the dimension is not a number."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # a protobuf DecodeError, or the file unreadable
        raise UserError(f"{path} is not a readable ONNX model ({exc}); export it again with "
                        "`stgcnd export`") from None
    outputs = [o for o in graph.output if o.name == OUTPUT_NAME] or list(graph.output[:1])
    dims = outputs[0].type.tensor_type.shape.dim if outputs else []
    last = dims[-1].dim_value if dims else 0
    return int(last) if last > 0 else None
