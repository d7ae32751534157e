"""Start-up progress for `stgcnd demo`: the daemon's JSON log events, as one line per step.

The daemon logs every slow step of its start (export, validation, backend choice, warm-up) as a
JSON line; the demo follows its log file and says what is happening, with elapsed time, instead
of printing nothing until the daemon is ready.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


class LogFollower:
    """New complete JSON lines of a growing log file (partial last lines wait for the rest)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._pos = 0
        self._partial = ""

    def events(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                f.seek(self._pos)
                text = f.read()
                self._pos = f.tell()
        except OSError:
            return []
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a non-JSON line (a warning from a library): not a step
            if isinstance(event, dict):
                out.append(event)
        return out


def _ms(event: dict[str, Any]) -> str:
    timings = {k[:-3]: v for k, v in event.items() if k.endswith("_ms")}
    return ", ".join(f"{k} {v:.0f} ms" for k, v in timings.items())


def _validated(e: dict[str, Any]) -> str:
    return (f"validated {e.get('backend')} {e.get('precision')}: max |diff| "
            f"{e.get('max_abs_diff', float('nan')):.1e} vs the reference, top-1 agreement "
            f"{100 * e.get('top1_agreement', 0):.0f}% on {e.get('windows')} windows")


# event name -> one line (None: not worth a line). Steps that take long say so as they start.
# (demo_model is not one: `stgcnd demo` says it once itself, before the daemon starts.)
STEPS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "onnx_export_needed": lambda e: f"exporting the model to ONNX ({e.get('reason')}) ...",
    "onnx_exported": lambda e: (f"ONNX exported and checked (max |diff| "
                                f"{e.get('max_abs_diff') or 0:.1e} vs the reference)"),
    "engine_build_started": lambda e: (f"building the {e.get('backend')} {e.get('precision')} "
                                       f"artefact ({e.get('reason')}) ..."),
    "engine_validated": _validated,
    "engine_rebuilt": lambda e: (f"{e.get('backend')} artefact built and stored in the engine "
                                 f"store (reused next time)"),
    "engine_reused": lambda e: (f"using the {e.get('backend')} artefact built above"
                                if e.get("built_here") else
                                f"reusing the stored {e.get('backend')} artefact"),
    "auto_backend_skipped": lambda e: f"backend choice: skipping {e.get('backend')}: "
                                      f"{e.get('reason')}",
    "auto_backend_measured": lambda e: (f"backend choice: measured {_ms(e)} per window; "
                                        f"using {e.get('backend')}"),
    "auto_backend_cached": lambda e: (f"backend choice: {e.get('backend')} "
                                      f"{e.get('precision')} (measured earlier; `stgcnd build "
                                      "--rebuild` measures again)"),
    "backend_loaded": lambda e: f"{e.get('backend')} session loaded on {e.get('device')}",
    "precision_fallback": lambda e: (f"precision: {e.get('asked')} is not offered by "
                                     f"{e.get('backend')} here, serving {e.get('using')} "
                                     f"({e.get('reason')})"),
    "model_ready": lambda e: (f"model {e.get('model')!r} warmed up and ready: "
                              f"{e.get('backend')} {e.get('precision')} on {e.get('device')} "
                              f"({e.get('seconds')} s)"),
    "camera_rate_at_risk": lambda e: f"warning: {e.get('hint')}",
    "ready": lambda e: f"daemon ready on {e.get('endpoint')}",
}


def describe(event: dict[str, Any]) -> str | None:
    """One line for a start-up step, errors included; None for other events."""
    if event.get("level") in ("error", "critical"):
        text = event.get("message") or event.get("error") or ""
        return f"error: {event.get('event')} {text}".rstrip()
    step = STEPS.get(str(event.get("event")))
    return step(event) if step else None
