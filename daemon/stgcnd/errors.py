"""Errors that reach the user as one line.

A `UserError` means the user can fix it (a wrong path, a flag, a checkpoint for another
architecture); its message says how. The CLI prints it without a traceback and exits non-zero.
Anything else is a bug in stgcnd and keeps its traceback.
"""

from __future__ import annotations


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


class BuildCancelled(Exception):
    """A build or start-up was abandoned on request (SIGTERM/SIGINT); nothing partial is kept.

    Not a UserError: nothing is wrong, the caller asked to stop.
    """
