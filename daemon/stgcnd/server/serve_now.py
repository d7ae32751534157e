"""What serves a model at once while its configured artefact is built in the background, and
the priority that build runs at (#45; the swap itself is server/upgrade.py). Apart from
upgrade.py so that models.py, which calls `serve_now_instead` while it loads, imports no module
that imports it back."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from stgcnd.engines.store import EngineStore
from stgcnd.errors import BackendUnavailable
from stgcnd.log import get_logger
from stgcnd.model.spec import ModelSpec
from stgcnd.provision.load import Choice, serving_options
from stgcnd.runtimes import available, runtime_module
from stgcnd.runtimes.base import Runtime

log = get_logger(__name__)

T = TypeVar("T")

IDLE_NICE = 19        # the build child's niceness where SCHED_IDLE is not allowed


@dataclasses.dataclass
class Pending:
    """What a served model is still building: the choice its configuration asks for."""

    choice: Choice
    spec: ModelSpec
    # A reload's (ModelConfig.engine): the configuration the upgrade serves, while the runners
    # of the one before serve meanwhile; None at a start (the runners stand in for it already).
    engine: tuple[object, ...] | None = None
    due: float = 0.0          # monotonic: the next attempt starts at or after this
    attempts: int = 0
    started: bool = False     # its build runs now (server/upgrade.py keeps its future)

    def describe(self) -> dict[str, object]:
        o = self.choice.options
        out: dict[str, object] = {"backend": self.choice.backend, "precision": o.precision,
                                  "device": o.device, "attempts": self.attempts}
        if self.choice.backend == "torch":  # what tells the tuned kernels from the default
            out["compile"] = o.compile
        return out


def serve_now_instead(choice: Choice, spec: ModelSpec, store: EngineStore,
                      auto: bool = False) -> Choice | None:
    """The choice that serves at once while `choice`'s artefact is built, or None (it is in
    the store already, or nothing quicker serves it). On a CPU an int8 (or fp16/bf16) ONNX
    Runtime model is served by the fp32 session: its build is an export, no calibration.
    `auto` (backend "auto"): TensorRT's engine is served meanwhile by the CPU runtime the
    chain falls back to (`cpu_while_tensorrt_builds`). torch with compile "auto" on CUDA is
    served by inductor's default kernels while its buckets are autotuned
    (`default_kernels_while_tuning`)."""
    if choice.opened is not None:
        return None
    if choice.backend == "tensorrt":
        return cpu_while_tensorrt_builds(choice, spec, store) if auto else None
    if choice.backend == "torch":
        o = choice.options
        if o.compile != "auto" or o.device != "cuda" or not o.cuda_graph:
            return None
        return default_kernels_while_tuning(choice, spec, store, _why_not_tuned())
    if choice.backend != "onnxruntime" or choice.options.precision == "fp32":
        return None
    if store.find(spec, choice.backend, choice.options) is not None:
        return None
    return Choice(choice.backend, dataclasses.replace(choice.options, precision="fp32"),
                  f"fp32 serves while {choice.options.precision} builds ({choice.why})")


def cpu_while_tensorrt_builds(choice: Choice, spec: ModelSpec, store: EngineStore
                              ) -> Choice | None:
    """ONNX Runtime fp32 on the CPU (else torch's) while TensorRT's engine, not in the store,
    builds: its artefact is the export TensorRT builds from anyway, it needs no GPU memory
    (the build and then the engine's runners get the plan's budget), and it is the runtime
    the auto chain ends on. Only for backend "auto": a named "tensorrt" promised TensorRT,
    and its failure stops the start as before. None where TensorRT cannot run here (the
    chain then skips it as before)."""
    ready = available()
    if ready["tensorrt"] is not None:
        return None
    options = serving_options(choice.options)  # what the engine is looked up and built with
    if store.find(spec, choice.backend, options, quiet=True) is not None:
        return None
    cpu = next((name for name in ("onnxruntime", "torch") if ready[name] is None), None)
    if cpu is None:
        return None
    choice.options = options
    return Choice(cpu, dataclasses.replace(options, device="cpu", precision="fp32",
                                           cuda_graph=False, compile="off"),
                  f"{cpu} fp32 on the CPU serves while tensorrt builds ({choice.why})")


def current_runners_serve_on(choice: Choice, now: Choice | None, spec: ModelSpec,
                             store: EngineStore) -> bool:
    """A reload that asks for `choice`: whether the model's current runners serve on while it
    is built, rather than `now` (serve_now_instead's answer, made fresh). They do where `now`
    is a lesser stand-in (the CPU for a TensorRT engine, the fp32 session for int8), and
    where there is none and a TensorRT engine not in the store must be built (a start builds
    a named TensorRT model's engine before READY, having nothing else to serve it with).
    torch's default kernels (seconds a bucket) serve the new configuration at once, as at a
    start, while its buckets are tuned; exports (seconds) are made by the reload."""
    if now is not None:
        return not (now.backend == choice.backend == "torch")
    if choice.opened is not None or choice.backend != "tensorrt":
        return False
    options = serving_options(choice.options)
    return store.find(spec, choice.backend, options, quiet=True) is None


def default_kernels_while_tuning(choice: Choice, spec: ModelSpec, store: EngineStore,
                                 why_not_tuned: str | None) -> Choice | None:
    """compile "auto" on CUDA (with CUDA graphs) means: serve inductor's default kernels now
    and autotune every bucket in the background (max-autotune's trials, the build child at idle
    priority), a bucket kept tuned only where its kernels passed the fp32 reference and
    measured faster than the default ones (engines/builders/torch_autotune.py); once the trials
    are in the store a start serves them at READY. `choice` becomes that target. None (the
    default kernels serve, as before) where max-autotune cannot run (`why_not_tuned`: no
    Triton, as with JetPack's torch), or where the trials are stored: the choice serves them."""
    if why_not_tuned is not None:
        return None
    now = choice.options
    choice.options = dataclasses.replace(now, compile="max-autotune")
    if store.find(spec, choice.backend, choice.options, quiet=True) is not None:
        return None
    # Kernels dynamic in the batch: two or three compiles instead of one per bucket (READY
    # with the ten default buckets 33.3 s against 70.2 s static on an H100, as fast a batch:
    # docs/performance.md); the tuned runtime's buckets are static, as their trials were.
    return Choice(choice.backend, dataclasses.replace(now, compile="reduce-overhead",
                                                      dynamic_kernels=True),
                  f"the default kernels serve while each bucket is autotuned ({choice.why})")


def _why_not_tuned() -> str | None:
    """Why max-autotune cannot run on this machine's CUDA device, or None (imports torch:
    only asked for a torch model on CUDA)."""
    try:
        torch_runtime = runtime_module("torch")
        why: str | None = torch_runtime.torch_compile.unavailable(torch_runtime.cuda_device())
        return why
    except BackendUnavailable as exc:  # no CUDA: the load says so, as before
        return str(exc)


def at_idle_priority(work: Callable[[], T]) -> T:
    """`work` on a thread of its own at the lowest CPU priority (SCHED_IDLE where allowed,
    else nice 19), which the build child it spawns inherits. A thread of its own: Linux keeps
    priorities per thread and an unprivileged one cannot raise its own back, and the runners
    made after the build (whose pools' threads inherit too) must serve at normal priority."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        _lower_this_thread()
        try:
            result.append(work())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="upgrade-build", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _lower_this_thread() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
        return
    except (AttributeError, OSError):  # not Linux, or refused (a container's policy)
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), IDLE_NICE)
    except (AttributeError, OSError):
        log.warning("upgrade_priority_unchanged",
                    reason="neither SCHED_IDLE nor nice 19 is allowed here; the background "
                           "build runs at normal priority")


def serving(runtime: Runtime) -> dict[str, object]:
    """What answers a model's requests now (hello's and stats' `serving`)."""
    info = runtime.info
    out: dict[str, object] = {"backend": info.name, "precision": info.precision,
                              "device": info.device}
    if "compile" in info.details:  # torch on CUDA: the default kernels, or the tuned ones
        out["compile"] = info.details["compile"]
    return out
