"""The models the daemon serves: configured, built or reused, loaded and warmed up."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from stgcnd.errors import BuildCancelled, UserError
from stgcnd.log import get_logger
from stgcnd.model.spec import default_labels
from stgcnd.server.config import Config, ModelConfig
from stgcnd.server.executor import Executor
from stgcnd.server.loop_executor import LoopExecutor
from stgcnd.server.outbox import Outbox, Reply
from stgcnd.server.scheduler import Job, Scheduler
from stgcnd_client.protocol import ErrorCode, encode_reply

log = get_logger(__name__)


@dataclass
class ServedModel:
    """One configured model: its loaded backend, its scheduler and its executors.

    The backend (weights or engine) is loaded by whichever thread loads the configuration; the
    executors then make their own runners in their own threads and warm every bucket before
    `start` returns, so nothing device-side is left for a request to trigger.
    """

    config: ModelConfig
    backend: Any                       # stgcnd.backends.base.Backend
    labels: tuple[str, ...]
    demo: bool
    generation: int
    max_batch: int = 1
    scheduler: Scheduler | None = field(default=None, repr=False)
    executors: list[Any] = field(default_factory=list, repr=False)  # Executor | LoopExecutor
    _loop_driven: bool | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.backend.info.input_shape)

    # -- life ------------------------------------------------------------------------------
    @property
    def loop_driven(self) -> bool:
        """Whether the I/O loop drives this model's runners (config `dispatch`; for "auto",
        decided for good once the runners are prepared, see `_start_loop_driven`)."""
        if self._loop_driven is not None:
            return self._loop_driven
        dispatch = self.config.dispatch
        if dispatch == "auto":
            return bool(self.backend.nonblocking_runners)
        return dispatch == "loop"

    def start(self, outbox: Outbox, queue_size: int, lanes: int, warmup_runs: int,
              on_fatal: Callable[[BaseException], None]) -> None:
        """Make the executors; return once every one has made and warmed its runner."""
        mc = self.config
        self.scheduler = Scheduler(queue_size, mc.max_queue_delay_us)
        buckets = [b for b in mc.buckets if b <= self.max_batch] or [1]
        prepared: list[Any] = []
        if self.loop_driven:
            prepared = self._start_loop_driven(buckets, lanes, warmup_runs, on_fatal)
            if self._loop_driven:
                return
        self._loop_driven = False
        self.executors = [Executor(self, i, self.scheduler, outbox, buckets, lanes,
                                   warmup_runs, on_fatal,
                                   prepared=prepared[i] if prepared else None)
                          for i in range(mc.instances)]
        for ex in self.executors:
            ex.start()
        for ex in self.executors:
            ex.ready.wait()
        failed = next((ex.error for ex in self.executors if ex.error is not None), None)
        if failed is not None:
            self._prepare_failed(failed)

    def _start_loop_driven(self, buckets: list[int], lanes: int, warmup_runs: int,
                           on_fatal: Callable[[BaseException], None]) -> list[Any]:
        """Prepare loop-driven executors. With dispatch "auto", a prepared runner may turn
        out to compute on launch after all (a TensorRT engine whose graphs could not be
        captured enqueues every kernel from Python): then the model gets executor threads
        instead, and the runners already made and warmed are handed to them (returned, one
        per executor), not prepared again; a runner belongs to no thread (its device
        resources come from the driver or torch)."""
        assert self.scheduler is not None
        if not self.backend.nonblocking_runners:
            raise UserError(f"model {self.name!r}: dispatch = \"loop\" needs runners that only "
                            f"enqueue device work (torch or TensorRT on CUDA with CUDA graphs, "
                            f"noop), not {self.backend.info.name} on {self.backend.info.device}; "
                            "use dispatch = \"auto\" or \"thread\"")
        self.executors = [LoopExecutor(self, i, self.scheduler, buckets, lanes, warmup_runs,
                                       on_fatal) for i in range(self.config.instances)]
        try:
            for ex in self.executors:
                ex.prepare()
        except Exception as exc:
            self._prepare_failed(exc)
        if self.config.dispatch == "auto" and not all(ex.runner.nonblocking
                                                      for ex in self.executors):
            log.info("dispatch_fallback", model=self.name, dispatch="thread",
                     reason="the runner computes on launch (no CUDA graphs)")
            prepared = [ex.hand_over() for ex in self.executors]
            self.executors = []
            return prepared
        self._loop_driven = True
        return []

    def _prepare_failed(self, exc: BaseException) -> NoReturn:
        self.stop(timeout=5.0)
        raise UserError(f"model {self.name!r}: could not prepare its executor: "
                        f"{type(exc).__name__}: {exc}") from exc

    def submit(self, job: Job, wake: bool = True) -> bool:
        return self.scheduler is not None and self.scheduler.submit(job, wake)

    def stop_accepting(self, drain_deadline: float | None = None) -> None:
        """Queued work still runs (until drain_deadline); new work is refused."""
        for ex in self.executors:
            ex.drain_deadline = drain_deadline
        if self.scheduler is not None:
            self.scheduler.close()

    def stop(self, timeout: float) -> bool:
        """Stop accepting, let the executors drain and exit; True when all exited in time.

        For a model that never served (a failed start or reload): loop-driven executors are
        closed here, since no loop drives them; served ones drain in the I/O loop instead."""
        self.stop_accepting(time.monotonic() + timeout)
        end = time.monotonic() + timeout
        for ex in self.executors:
            if isinstance(ex, LoopExecutor):
                ex.close()
            else:
                ex.join(max(end - time.monotonic(), 0.0))
        return not any(ex.is_alive() for ex in self.executors)

    def close(self) -> None:
        """Free the backend once no executor runs (executors close their own runners)."""
        if any(ex.is_alive() for ex in self.executors):
            return
        self.backend.close()
        log.info("model_closed", model=self.name, generation=self.generation)

    # -- answers ---------------------------------------------------------------------------
    def replies(self, jobs: list[Job], logits: np.ndarray, started: float, compute_ms: float,
                batch: int, bucket: int, stages: dict[str, float]) -> list[Reply]:
        """Encode one reply per job from its row of the batch's logits."""
        out = []
        done = time.monotonic()
        compute = round(compute_ms, 3)
        # Plain floats, row by row: with a handful of classes, numpy's per-call overhead
        # (isfinite, softmax, argmax over the batch) cost more than this whole loop, and it
        # runs on the I/O loop for every reply. Softmax in double precision, as before.
        for job, row in zip(jobs, logits.tolist()):
            timings = {**stages, "queue_ms": round((started - job.received) * 1e3, 3),
                       "compute_ms": compute, "batch": batch, "bucket": bucket,
                       "total_ms": round((done - job.received) * 1e3, 3)}
            if not all(map(math.isfinite, row)):
                # Inputs of huge magnitude overflow float32 (or float16 engines) inside the
                # network: a NaN prediction must never reach a client as if it were one.
                out.append(Reply(job, encode_reply(job.req_id, error=(
                    ErrorCode.NON_FINITE.value,
                    "the model produced non-finite logits for this window (values too large "
                    "for the network's precision); send normalized keypoints (x, y in 0..1 "
                    "or pixels, visibility in 0..1)")), "error", timings))
                continue
            top = max(row)
            exps = [math.exp(v - top) for v in row]
            total = sum(exps)
            label = row.index(top)  # the first of equal maxima, as numpy's argmax
            result = {**job.extra, "model": self.name, "logits": row,
                      "probs": [e / total for e in exps], "label": label,
                      "label_name": self.labels[label], "timings": timings}
            out.append(Reply(job, encode_reply(job.req_id, result), "ok", timings))
        return out

    def describe(self, default: bool) -> dict[str, Any]:
        info = self.backend.info
        return {"name": self.name, "input_shape": list(info.input_shape),
                "num_class": info.num_class, "labels": list(self.labels),
                "backend": info.name, "precision": info.precision, "default": default,
                "stride": self.config.stride, "demo": self.demo, "max_batch": self.max_batch}

    def stats(self) -> dict[str, Any]:
        info = self.backend.info
        return {"backend": info.name, "precision": info.precision, "device": info.device,
                "max_batch": self.max_batch,
                "dispatch": "loop" if self.loop_driven else "thread",
                "queued": self.scheduler.pending if self.scheduler else 0,
                "executors": [{"alive": ex.is_alive(), "batches": ex.batches,
                               "windows": ex.windows,
                               "compute_ms": {str(b): round(v, 3)
                                              for b, v in sorted(ex.compute_ms.items())}}
                              for ex in self.executors]}


def _spec(mc: ModelConfig) -> Any:
    from stgcnd.model.spec import ModelSpec

    try:
        return ModelSpec(checkpoint=mc.checkpoint, layout=mc.layout, persons=mc.persons,
                         frames=mc.frames, motion=mc.motion, labels=mc.labels)
    except ValueError as exc:
        raise UserError(f"model {mc.name!r}: {exc}") from None


def resolve_max_batch(mc: ModelConfig, device: str) -> int:
    """max_batch 0 (auto): the largest default bucket on a GPU, where batching multiplies
    throughput; 16 on a CPU, where it only saves per-call overhead."""
    if mc.max_batch:
        return mc.max_batch
    from stgcnd.backends.registry import gpu_present

    gpu = device.startswith("cuda") or (mc.backend in ("auto", "torch", "tensorrt")
                                        and mc.device == "auto" and gpu_present())
    return AUTO_MAX_BATCH_GPU if gpu else AUTO_MAX_BATCH_CPU


AUTO_MAX_BATCH_GPU = 64
AUTO_MAX_BATCH_CPU = 16


def load_models(config: Config, generation: int = 1,
                keep: dict[str, ServedModel] | None = None,
                start: Callable[[ServedModel], None] | None = None,
                cancel: threading.Event | None = None) -> dict[str, ServedModel]:
    """Build or reuse every configured model's artefact, load it, and `start` its executors
    (which warm every bucket) before returning.

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
            max_batch = resolve_max_batch(mc, device)
            options = BuildOptions(precision=mc.precision, max_batch=max_batch, device=device,
                                   dynamic_batch=max_batch > 1, calibration=mc.calibration,
                                   allow_synthetic_calibration=mc.allow_synthetic_calibration,
                                   cuda_graph=mc.cuda_graph and device != "cpu",
                                   threads=mc.threads)
            spec = _spec(mc)
            try:
                backend = open_backend(spec, mc.backend, options, store)
            except UserError as exc:
                # Name the model, keep the type (StoreReadOnly, CheckpointError...) and hint.
                exc.args = (f"model {mc.name!r}: {exc}",)
                raise exc from None
            if mc.noop_compute_us:
                backend.compute_us = mc.noop_compute_us
            labels = tuple(mc.labels) or tuple(getattr(backend.info, "details", {}).get(
                "labels", ())) or default_labels(backend.info.num_class)
            served = ServedModel(mc, backend, labels, demo=mc.checkpoint is None,
                                 generation=generation,
                                 max_batch=min(max_batch, int(backend.info.max_batch)))
            loaded[mc.name] = served
            if start is not None:
                start(served)
            log.info("model_ready", model=mc.name, backend=backend.info.name,
                     precision=backend.info.precision, device=backend.info.device,
                     input_shape=list(backend.info.input_shape), demo=served.demo,
                     max_batch=served.max_batch, instances=mc.instances,
                     dispatch="loop" if served.loop_driven else "thread",
                     buckets=list(served.executors[0].buckets) if served.executors else [],
                     compute_ms={str(b): round(v, 3) for b, v in sorted(
                         served.executors[0].compute_ms.items())} if served.executors else {},
                     seconds=round(time.perf_counter() - t0, 2))
    except BaseException:
        for name, served in loaded.items():
            if (keep or {}).get(name) is not served:
                served.stop(timeout=5.0)
                served.close()
        raise
    return loaded
