"""Windows for INT8 calibration and validation: user files (.npy/.npz) or synthetic skeletons.

INT8 scales are learnt from the activations seen on calibration windows; windows that are not
what the deployed model sees give scales that clip or waste range. So stgcnd refuses INT8
without calibration data unless the user says synthetic windows are acceptable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stgcnd.errors import UserError
from stgcnd.log import get_logger
from stgcnd.model.synthetic import synthetic_windows

log = get_logger(__name__)

SYNTHETIC_CALIBRATION_WINDOWS = 64
SYNTHETIC_SEED = 20260101


def load_windows(path: Path, input_shape: tuple[int, ...], what: str = "windows") -> np.ndarray:
    """All windows (N, 3, T, V, M) in an .npy, or in every 5-D array of an .npz, as float32."""
    path = Path(path)
    want = tuple(input_shape)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (AttributeError, TypeError):  # an .npy gives an array, not a context manager
        arrays = {"array": np.load(path, allow_pickle=False)}
    except FileNotFoundError:
        raise UserError(f"{what} file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {what} from {path}: {exc}; give an .npy or .npz of "
                        f"float windows shaped (N, {', '.join(map(str, want))})") from None
    picked = []
    for name, arr in arrays.items():
        if arr.ndim != len(want) + 1:
            log.info("windows_array_skipped", path=str(path), array=name, shape=list(arr.shape))
            continue
        if tuple(arr.shape[1:]) != want:
            raise UserError(
                f"{what} array {name!r} in {path} has shape {tuple(arr.shape)}, but the model "
                f"takes (N, {', '.join(map(str, want))}) (3 channels, T frames, V joints, "
                "M persons); record windows with the model's --frames/--persons/--layout")
        if not np.issubdtype(arr.dtype, np.floating):
            raise UserError(f"{what} array {name!r} in {path} is {arr.dtype}; windows are float")
        picked.append(arr.astype(np.float32, copy=False))
    if not picked or sum(len(a) for a in picked) == 0:
        raise UserError(f"no {what} in {path}: expected arrays shaped "
                        f"(N, {', '.join(map(str, want))})")
    windows = np.ascontiguousarray(np.concatenate(picked))
    if not np.isfinite(windows).all():
        raise UserError(f"{what} in {path} contain NaN or infinity; clean the recording")
    return windows


def refuse_without_calibration(input_shape: tuple[int, ...] | None = None) -> None:
    shape = f"(N, {', '.join(map(str, input_shape))})" if input_shape else "(N, 3, T, V, M)"
    raise UserError(
        f"INT8 needs calibration windows: pass --calibration FILE.npz|npy with windows shaped "
        f"{shape} recorded from your cameras (a few hundred is plenty), or "
        "--allow-synthetic-calibration to calibrate on generated skeletons (accuracy then "
        "unknown: run `stgcnd validate --windows` on real windows)")


def calibration_windows(options: Any, spec: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """The INT8 calibration windows for `options` (BuildOptions) and `spec` (ModelSpec)."""
    if options.calibration is not None:
        windows = load_windows(options.calibration, spec.input_shape, "calibration windows")
        return windows, {"source": str(options.calibration), "windows": len(windows)}
    if not options.allow_synthetic_calibration:
        refuse_without_calibration(spec.input_shape)

    n = SYNTHETIC_CALIBRATION_WINDOWS
    windows = synthetic_windows(n, spec.frames, spec.persons, spec.num_node, seed=SYNTHETIC_SEED)
    log.warning("synthetic_calibration", windows=n,
                message="INT8 calibrated on generated skeletons; validate on real windows")
    return windows, {"source": "synthetic", "windows": n, "seed": SYNTHETIC_SEED}
