"""Does an artefact compute what the fp32 PyTorch reference computes? Numbers, not opinions.

`validate_backend` runs any Backend (the runtime contract in stgcnd.backends.base) on windows
and compares its logits with `reference_logits`: the largest and mean absolute difference, and
top-1 agreement (the fraction of windows whose argmax class is the same), which is what a user
of a classifier sees.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stgcnd.errors import ValidationError
from stgcnd.log import get_logger

log = get_logger(__name__)

DEFAULT_VALIDATION_WINDOWS = 8
VALIDATION_SEED = 4242


def compare_logits(ref: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if ref.shape != got.shape:
        raise ValidationError(f"the artefact returned logits shaped {got.shape}, the reference "
                              f"{ref.shape}; the artefact was built for another model: rebuild "
                              "it with `stgcnd build`")
    diff = np.abs(got - ref)
    finite = bool(np.isfinite(got).all())
    return {"windows": len(ref),
            "max_abs_diff": float(diff.max()) if finite else float("inf"),
            "mean_abs_diff": float(diff.mean()) if finite else float("inf"),
            "top1_agreement": float(np.mean(ref.argmax(1) == got.argmax(1))),
            "finite": finite}


def backend_logits(backend: Any, windows: np.ndarray) -> np.ndarray:
    """Logits of `windows` through sessions of `backend`, in chunks of its max batch."""
    step = max(1, int(backend.info.max_batch))
    outs = []
    with backend.open_session() as session:
        for i in range(0, len(windows), step):
            outs.append(np.asarray(session.infer(np.ascontiguousarray(windows[i:i + step])),
                                   dtype=np.float32))
    return np.concatenate(outs)


def default_windows(spec: Any, n: int = DEFAULT_VALIDATION_WINDOWS) -> np.ndarray:
    from stgcnd.model.synthetic import synthetic_windows

    return synthetic_windows(n, spec.frames, spec.persons, spec.num_node, seed=VALIDATION_SEED)


def validate_backend(model: Any, backend: Any, windows: np.ndarray | None = None
                     ) -> dict[str, Any]:
    """Compare a Backend with the fp32 PyTorch reference of `model` (a LoadedModel)."""
    from stgcnd.model.reference import reference_logits

    windows = default_windows(model.spec) if windows is None else windows
    ref = reference_logits(model, windows)
    got = backend_logits(backend, windows)
    result = compare_logits(ref, got)
    result.update(backend=backend.info.name, precision=backend.info.precision,
                  device=backend.info.device)
    log.info("engine_validated", **result)
    return result
