"""Errors that reach the user as one line.

A `UserError` means the user can fix it (a wrong path, a flag, a checkpoint for another
architecture); its message says how. The CLI prints it without a traceback and exits non-zero.
Anything else is a bug in stgcnd and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class UserError(Exception):
    """A problem the user can fix; the message says what to do."""

    exit_code = 2
    # What to do about it, when the message alone does not say (logged as `hint`).
    hint: str | None = None


class CheckpointError(UserError):
    """The checkpoint cannot be loaded into the model it claims to be."""


class ValidationError(UserError):
    """An exported or built artefact does not compute what the PyTorch reference computes."""

    exit_code = 3


class BackendUnavailable(UserError):
    """The requested backend or precision cannot run on this machine."""


class StoreReadOnly(UserError):
    """An artefact must be built but the engine store cannot be written."""


class RuntimeFailed(UserError):
    """A runtime could not be made ready for a model at one step: import, build, load,
    context (its runner: contexts, buffers, graphs), warm-up or memory (the plan did not fit).
    With backend "auto" the daemon falls back to the next runtime; a runtime named in the
    configuration fails start-up with this one line."""

    STEPS = ("import", "build", "load", "context", "warm-up", "memory")

    def __init__(self, runtime: str, step: str, reason: str) -> None:
        super().__init__(f"the {runtime} runtime failed at {step}: {reason}")
        self.runtime, self.step, self.reason = runtime, step, reason

    def __reduce__(self) -> tuple[object, ...]:  # crosses the build child's pipe
        return (type(self), (self.runtime, self.step, self.reason))


def first_line(text: str, limit: int = 300) -> str:
    """The first non-blank line of an error's text, at most `limit` characters: what a log
    line or a one-line error quotes of a runtime's (often multi-line) message."""
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


@contextmanager
def at_step(step: str) -> Iterator[None]:
    """Note on any exception raised inside at which step of making a runtime ready it
    happened (the innermost step wins); the exception itself passes through unchanged, so
    that a named backend fails with its own one-line message."""
    try:
        yield
    except BaseException as exc:
        if "stgcnd_step" not in exc.__dict__:
            exc.__dict__["stgcnd_step"] = step
        raise


def step_of(exc: BaseException, default: str = "load") -> str:
    """The step an error was tagged with (at_step), else its own (RuntimeFailed), else
    `default`."""
    own = exc.step if isinstance(exc, RuntimeFailed) else default
    return str(exc.__dict__.get("stgcnd_step", own))


class BuildFailed(UserError):
    """The runtime refused to build the artefact (TensorRT out of memory, an unsupported
    layer...); the store records it (PreviousBuildFailed next time)."""


class PreviousBuildFailed(UserError):
    """This exact build (same model, runtime, options, versions, device) failed before: it
    is not retried at every start (the store keeps a record of the failure)."""


class BuildProcessDied(BuildFailed):
    """The build's child process ended without an answer (SIGKILL: usually the out-of-memory
    killer); the store records it as a failed attempt."""

    def __init__(self, message: str, pid: int, how: str) -> None:
        super().__init__(message)
        self.pid, self.how = pid, how


class BuildCancelled(Exception):
    """A build or start-up was abandoned on request (SIGTERM/SIGINT); nothing partial is kept.

    Not a UserError: nothing is wrong, the caller asked to stop.
    """
