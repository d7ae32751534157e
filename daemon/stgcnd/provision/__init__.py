"""Provisioning a served model: which runtime runs it, its artefact built or reused, loaded.

`first_that_serves(spec, backend, options, store, use)` is the one walk of the choices, made
by the daemon, `build` and `validate` (`open_runtime`: it, for a loaded runtime); `bench`
loads each named runtime with `provision.load.load_runtime`. "auto" (provision/auto.py) is
imported only for a model whose backend is auto: a named one never loads its timing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.errors import BuildCancelled, UserError, first_line, step_of
from stgcnd.log import get_logger
from stgcnd.provision.load import Choice, ModelLike, named_options
from stgcnd.runtimes.base import Runtime

log = get_logger(__name__)

T = TypeVar("T")


def open_runtime(model: ModelLike, backend: str, options: BuildOptions,
                 store: EngineStore, noop_compute_us: int = 0) -> Runtime:
    """Prepare (export/build or reuse) the artefact and load it; runners come from it. For
    "auto", the first runtime of the chain that loads (first_that_serves)."""
    return first_that_serves(model, backend, options, store,
                             lambda choice: choice.load(model, store, noop_compute_us))[0]

def first_that_serves(model: ModelLike, backend: str, options: BuildOptions,
                      store: EngineStore, use: Callable[[Choice], T]) -> tuple[T, Choice]:
    """`use` of the first choice it succeeds on, and that choice: the one walk of the auto
    chain, for the daemon (its `use` also makes and warms the runners), `build` and
    `validate`. A named backend is its only choice and its failure is raised as it is; with
    "auto" each failure is logged (`backend_fallback`) and the next choice tried, and a
    chain that runs out raises one UserError that lists them. A runtime opened while choosing
    and not taken by `use` (Choice.load) is closed."""
    if backend != "auto":
        choice = Choice(backend, named_options(backend, options), "named")
        return use(choice), choice
    failures = []
    try:
        for choice in _auto_chain(model, options, store):
            try:
                used = use(choice)
            except (BuildCancelled, KeyboardInterrupt):
                raise
            except Exception as exc:
                failures.append(fallback(choice, exc))
                continue
            finally:
                choice.close()
            log.info("auto_backend", backend=choice.backend, device=choice.options.device,
                     precision=choice.options.precision, why=choice.why)
            return used, choice
    except UserError as exc:  # the chain itself failed: e.g. no CPU runtime loads the model
        if "stgcnd_step" in exc.__dict__:
            raise
        failures.append(str(exc))
    raise no_runtime_left(failures)

def _auto_chain(model: ModelLike, options: BuildOptions, store: EngineStore
                ) -> Iterator[Choice]:
    """provision.auto's chain, imported now: only a model whose backend is auto pays for it."""
    from stgcnd.provision.auto import auto_chain

    return auto_chain(model, options, store)


def fallback(choice: Choice, exc: BaseException) -> str:
    """Log one runtime's failure (one line, no traceback); returns it for the final error."""
    step, reason = step_of(exc), first_line(str(exc)) or type(exc).__name__
    log.warning("backend_fallback", runtime=choice.backend, step=step, reason=reason,
                error_type=type(exc).__name__)
    return f"{choice.backend} at {step}: {reason}"


def no_runtime_left(failures: list[str]) -> UserError:
    return UserError("no runtime could serve this model: " + "; ".join(failures) +
                     ". `stgcnd doctor` checks the installs")
