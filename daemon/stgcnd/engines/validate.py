"""Does an artefact compute what the fp32 PyTorch reference computes? Numbers, not opinions.

`validate_backend` runs any runtime through a runner and compares its logits with the
reference (max and mean |diff|, top-1 agreement); `validate_export` checks a fresh ONNX export
the same way with ONNX Runtime before the store keeps it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stgcnd.errors import ValidationError
from stgcnd.export import INPUT_NAME, OUTPUT_NAME
from stgcnd.log import get_logger
from stgcnd.model.reference import reference_logits
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.runtimes.onnxruntime_runtime import ort_session

log = get_logger(__name__)

DEFAULT_VALIDATION_WINDOWS = 8
VALIDATION_SEED = 4242
EXPORT_TOLERANCE = 1e-4


def compare_logits(ref: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        raise ValidationError(f"the artefact returned logits shaped {got.shape}, the reference "
                              f"{ref.shape}; the artefact was built for another model: rebuild "
                              "it with `stgcnd build`")
    diff = np.abs(got - ref)
    finite = bool(np.isfinite(got).all())
    change = margin_change(ref, got) if finite else np.array([np.inf])
    return {"windows": len(ref),
            "max_abs_diff": float(diff.max()) if finite else float("inf"),
            "mean_abs_diff": float(diff.mean()) if finite else float("inf"),
            "top1_agreement": float(np.mean(ref.argmax(1) == got.argmax(1))),
            "margin_change_median": float(np.median(change)),
            "margin_change_max": float(change.max()),
            "finite": finite}


def margin_change(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Per window, how much the reference's top-two logit margin moved (its two classes, in
    the reference's order): what decides a threshold on the score, beyond the top-1 class."""
    if ref.shape[1] < 2:
        return np.zeros(len(ref))
    rows = np.arange(len(ref))
    order = np.argsort(-ref, axis=1)[:, :2]
    first, second = order[:, 0], order[:, 1]
    return np.abs((got[rows, first] - got[rows, second]) - (ref[rows, first] - ref[rows, second]))


def backend_logits(runtime: Any, windows: np.ndarray) -> np.ndarray:
    """Logits of `windows` through a runner of `runtime` (the path the daemon serves with),
    in chunks of its max batch."""
    step = max(1, int(runtime.info.max_batch))
    runner = runtime.open_runner((step,), 0)
    try:
        return np.concatenate([runner.run(list(windows[i:i + step]))
                               for i in range(0, len(windows), step)])
    finally:
        runner.close()


def default_windows(spec: Any, n: int = DEFAULT_VALIDATION_WINDOWS) -> np.ndarray:
    return synthetic_windows(n, spec.frames, spec.persons, spec.num_node, seed=VALIDATION_SEED)


def validate_backend(model: Any, backend: Any, windows: np.ndarray | None = None
                     ) -> dict[str, Any]:
    """Compare a runtime with the fp32 PyTorch reference of `model` (a LoadedModel)."""
    windows = default_windows(model.spec) if windows is None else windows
    ref = reference_logits(model, windows)
    got = backend_logits(backend, windows)
    result = compare_logits(ref, got)
    result.update(backend=backend.info.name, precision=backend.info.precision,
                  device=backend.info.device)
    log.info("engine_validated", **result)
    return result


def validate_export(model: Any, onnx_data: bytes, dynamic_batch: bool,
                    windows: np.ndarray | None = None, tolerance: float = EXPORT_TOLERANCE
                    ) -> dict[str, Any]:
    """Max |ONNX Runtime - PyTorch| of an exported graph; ValidationError beyond tolerance."""
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
        got = np.concatenate([sess.run([OUTPUT_NAME], {INPUT_NAME: w[None]})[0]
                              for w in windows])
    diff = float(np.max(np.abs(got - ref)))
    if not np.isfinite(diff) or diff > tolerance:
        raise ValidationError(
            f"ONNX Runtime output differs from the reference by {diff:.3g} (> {tolerance:g}) on "
            f"{len(windows)} windows; the exported graph is not the same function. Report this "
            "with `stgcnd doctor` output; try --graph-op einsum.")
    return {"runtime": "onnxruntime-cpu", "max_abs_diff": diff, "tolerance": tolerance}
