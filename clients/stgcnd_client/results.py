"""Typed views of the maps the server sends back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import BadReply


@dataclass(frozen=True)
class Result:
    """One prediction.

    ``client_ms`` is the round trip measured by the client (send to reply, retries included);
    ``timings`` holds the server's own measurements (queue_ms, compute_ms, total_ms, ...).
    ``seq`` and ``frames`` are set in push mode: frames received so far for this camera and model,
    and frames currently buffered on the server.
    """

    model: str
    logits: np.ndarray
    probs: np.ndarray
    label: int
    label_name: str
    timings: dict[str, float]
    client_ms: float
    seq: int | None = None
    frames: int | None = None

    @classmethod
    def from_result(cls, result: Mapping[str, Any], client_ms: float) -> Result:
        try:
            return cls(model=str(result["model"]),
                       logits=np.asarray(result["logits"], dtype=np.float32),
                       probs=np.asarray(result["probs"], dtype=np.float32),
                       label=int(result["label"]), label_name=str(result["label_name"]),
                       timings=_timings(result.get("timings") or {}), client_ms=float(client_ms),
                       seq=_optional_int(result.get("seq")),
                       frames=_optional_int(result.get("frames")))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadReply(f"prediction reply is missing or mistypes a field: {exc!r}") from None


@dataclass(frozen=True)
class ModelInfo:
    """A model the server offers. ``input_shape`` is (3, T, V, M) without the batch axis."""

    name: str
    input_shape: tuple[int, ...]
    num_class: int
    labels: tuple[str, ...]
    backend: str
    precision: str
    default: bool
    stride: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """Shape of one frame for push(): (3, V, M)."""
        c, _, v, m = self.input_shape
        return (c, v, m)


@dataclass(frozen=True)
class ServerInfo:
    """The answer to hello()."""

    server: str
    protocol: int
    camera: str
    models: tuple[ModelInfo, ...]

    @property
    def default_model(self) -> ModelInfo | None:
        return next((m for m in self.models if m.default), None)

    def model(self, name: str | None = None) -> ModelInfo:
        """The named model, or the default one when name is None."""
        found = self.default_model if name is None else next(
            (m for m in self.models if m.name == name), None
        )
        if found is None:
            names = [m.name for m in self.models]
            raise KeyError(f"server has no model {name!r}; it offers {names}")
        return found

    @classmethod
    def from_result(cls, result: Mapping[str, Any]) -> ServerInfo:
        known = {"name", "input_shape", "num_class", "labels", "backend", "precision", "default",
                 "stride"}
        try:
            models = tuple(
                ModelInfo(name=str(m["name"]), input_shape=tuple(int(d) for d in m["input_shape"]),
                          num_class=int(m["num_class"]),
                          labels=tuple(str(label) for label in m.get("labels", ())),
                          backend=str(m.get("backend", "")), precision=str(m.get("precision", "")),
                          default=bool(m.get("default", False)), stride=int(m.get("stride", 1)),
                          extra={k: v for k, v in m.items() if k not in known})
                for m in result["models"]
            )
            return cls(server=str(result["server"]), protocol=int(result["protocol"]),
                       camera=str(result["camera"]), models=models)
        except (KeyError, TypeError, ValueError) as exc:
            raise BadReply(f"hello reply is missing or mistypes a field: {exc!r}") from None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _timings(raw: Mapping[str, Any]) -> dict[str, float]:
    # Servers may add timing keys; keep every number, skip anything that is not one.
    return {
        str(k): float(v)
        for k, v in dict(raw).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
