"""The models the daemon serves: configured, built or reused, loaded and warmed up."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stgcnd.errors import BuildCancelled, UserError
from stgcnd.log import get_logger
from stgcnd.model.spec import default_labels
from stgcnd.server.config import Config, ModelConfig

log = get_logger(__name__)


@dataclass
class ServedModel:
    """One configured model's loaded backend, and its sessions.

    Camera workers take sessions with `open_session` and give them back with
    `release_session`. Up to `config.warm_sessions` released sessions are kept open and warm
    (stream, buffers, CUDA graph already made), so a new camera's first request does not pay
    for building a session.
    """

    config: ModelConfig
    backend: Any                       # stgcnd.backends.base.Backend
    labels: tuple[str, ...]
    demo: bool
    generation: int
    open_sessions: int = 0             # held by camera workers
    retired: bool = False
    compute_ms_ewma: float = 0.0       # for deadline checks: can this request still make it?
    warm: list[Any] = field(default_factory=list, repr=False)  # open, idle, ready sessions
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.backend.info.input_shape)

    def open_session(self) -> Any:
        with self._lock:
            self.open_sessions += 1
            if self.warm:
                return self.warm.pop()
        try:
            return self.backend.open_session()
        except BaseException:
            with self._lock:
                self.open_sessions -= 1
            raise

    def release_session(self, session: Any) -> None:
        with self._lock:
            self.open_sessions -= 1
            keep = (not self.retired and not session.closed
                    and len(self.warm) < self.config.warm_sessions)
            if keep:
                self.warm.append(session)
        if not keep:
            session.close()
        self.maybe_close()

    def maybe_close(self) -> None:
        """Close a retired model once its last session is back."""
        with self._lock:
            if not (self.retired and self.open_sessions == 0):
                return
            self.retired = False  # close once
        self.close()
        log.info("model_closed", model=self.name, generation=self.generation)

    def close(self) -> None:
        """Close the warm sessions, then the backend. Sessions held by workers must be back."""
        with self._lock:
            warm, self.warm = self.warm, []
        for session in warm:
            session.close()
        self.backend.close()

    def observe_compute(self, ms: float) -> None:
        self.compute_ms_ewma = ms if not self.compute_ms_ewma else \
            0.9 * self.compute_ms_ewma + 0.1 * ms

    def describe(self, default: bool) -> dict[str, Any]:
        info = self.backend.info
        return {"name": self.name, "input_shape": list(info.input_shape),
                "num_class": info.num_class, "labels": list(self.labels),
                "backend": info.name, "precision": info.precision, "default": default,
                "stride": self.config.stride, "demo": self.demo}


def _spec(mc: ModelConfig) -> Any:
    from stgcnd.model.spec import ModelSpec

    try:
        return ModelSpec(checkpoint=mc.checkpoint, layout=mc.layout, persons=mc.persons,
                         frames=mc.frames, motion=mc.motion, labels=mc.labels)
    except ValueError as exc:
        raise UserError(f"model {mc.name!r}: {exc}") from None


def load_models(config: Config, generation: int = 1,
                keep: dict[str, ServedModel] | None = None,
                cancel: threading.Event | None = None) -> dict[str, ServedModel]:
    """Build or reuse every configured model's artefact, load it and warm it up.

    Models whose configuration is unchanged (`keep`) are reused as they are. Any failure is
    fatal to the whole load: the daemon never serves half a configuration.

    `cancel`: when set (SIGTERM during a first-start build), a running build is abandoned
    within seconds, leaving nothing partial in the store, and BuildCancelled is raised;
    builds then run in a child process (see stgcnd.engines.child_build).
    """
    from stgcnd.backends.registry import default_device, open_backend
    from stgcnd.engines.options import BuildOptions
    from stgcnd.engines.store import EngineStore

    store = EngineStore(config.engines_dir, cancel=cancel)
    loaded: dict[str, ServedModel] = {}
    try:
        for mc in config.models:
            if cancel is not None and cancel.is_set():
                raise BuildCancelled("start-up cancelled")
            old = (keep or {}).get(mc.name)
            if old is not None and old.config == mc:
                loaded[mc.name] = old
                continue
            t0 = time.perf_counter()
            # For "auto" backends the registry picks the device along with the backend.
            device = (mc.device if mc.device != "auto" else
                      "cpu" if mc.backend == "auto" else default_device(mc.backend))
            options = BuildOptions(precision=mc.precision, max_batch=mc.max_batch, device=device,
                                   dynamic_batch=mc.max_batch > 1, calibration=mc.calibration,
                                   allow_synthetic_calibration=mc.allow_synthetic_calibration,
                                   cuda_graph=mc.cuda_graph, threads=mc.threads)
            spec = _spec(mc)
            try:
                backend = open_backend(spec, mc.backend, options, store)
            except UserError as exc:
                # Name the model, keep the type (StoreReadOnly, CheckpointError...) and hint.
                exc.args = (f"model {mc.name!r}: {exc}",)
                raise exc from None
            labels = tuple(mc.labels) or tuple(getattr(backend.info, "details", {}).get(
                "labels", ())) or default_labels(backend.info.num_class)
            served = ServedModel(mc, backend, labels, demo=mc.checkpoint is None,
                                 generation=generation)
            loaded[mc.name] = served
            warm_up(served, config.server.warmup_runs)
            log.info("model_ready", model=mc.name, backend=backend.info.name,
                     precision=backend.info.precision, device=backend.info.device,
                     input_shape=list(backend.info.input_shape), demo=served.demo,
                     seconds=round(time.perf_counter() - t0, 2))
    except BaseException:
        for name, served in loaded.items():
            if (keep or {}).get(name) is not served:
                served.close()
        raise
    return loaded


def warm_up(model: ServedModel, runs: int) -> None:
    """Open the model's warm sessions and run each a few times, before READY=1, so that lazy
    allocations, kernel selection and CUDA graph capture are done before a camera arrives."""
    from stgcnd.model.synthetic import synthetic_windows

    _, t, v, m = model.input_shape
    x = synthetic_windows(1, t, m, v, seed=0)
    sessions = [model.open_session() for _ in range(max(model.config.warm_sessions, 1))]
    try:
        for session in sessions:
            for _ in range(runs):
                session.infer(x)
            if runs:
                model.observe_compute(session.last_timings.get("total_ms", 0.0))
    finally:
        for session in sessions:
            model.release_session(session)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max()
    e = np.exp(z)
    return e / e.sum()
