"""Builds that can be abandoned: the slow work runs in a child process that a cancel kills.

An export, calibration or TensorRT build runs for minutes inside C++, where Python cannot
interrupt it, and the daemon must still stop within seconds on SIGTERM: so a store with a
cancel event builds in a spawned interpreter (no CUDA context or lock inherited) that a cancel
terminates. A current artefact spawns nothing.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stgcnd.errors import BuildCancelled, BuildProcessDied, UserError
from stgcnd.log import configure_logging, get_logger, logging_config

log = get_logger(__name__)

CHILD_GRACE_S = 2.0     # SIGTERM -> SIGKILL: time for the child's own clean-up
POLL_S = 0.1            # how often the parent looks at the cancel event


def _raise_cancelled(signum: int, _frame: Any) -> None:
    raise BuildCancelled(f"signal {signum}")


def _child_main(conn: Any, store: Callable[[Path], Any], root: str, spec: Any, backend: str,
                options: Any, rebuild: str | None, validate: bool,
                log_config: dict[str, Any]) -> None:
    """In the child: prepare in-process and send back ("ok", reused, reason) or the error."""
    signal.signal(signal.SIGTERM, _raise_cancelled)
    signal.signal(signal.SIGINT, _raise_cancelled)
    configure_logging(**log_config)
    try:
        art = store(Path(root)).prepare(spec, backend, options, rebuild=rebuild,
                                        validate=validate)
        result: tuple[Any, ...] = ("ok", art.reused, art.reason)
    except BuildCancelled:
        result = ("cancelled",)
    except UserError as exc:
        result = ("error", exc)
    except Exception as exc:
        log.exception("engine_build_crashed", backend=backend, error=str(exc))
        result = ("error", exc)
    try:
        conn.send(result)
    except Exception:  # an exception that does not pickle: its text still gets through
        conn.send(("error", RuntimeError(f"{type(result[1]).__name__}: {result[1]}")))
    conn.close()


def remove_leftovers(root: Path, pid: int) -> list[str]:
    """Delete the temp files a (dead) writer `pid` left anywhere in the store."""
    removed = []
    for path in root.rglob(f".*.tmp-{pid}.*"):  # '.' after the pid: not pid 42 for 4242
        try:
            path.unlink()
            removed.append(str(path))
        except OSError:
            pass
    return removed


def _stop_child(proc: Any) -> None:
    if proc.is_alive():
        proc.terminate()  # SIGTERM: BuildCancelled in the child, its finally blocks run
        proc.join(CHILD_GRACE_S)
    if proc.is_alive():
        proc.kill()       # stuck in C++ (a TensorRT build, a quantization step)
        proc.join()


# On cancel the child gets SIGTERM, which it turns into `BuildCancelled` so its own clean-up
# runs; a child stuck in C++ is killed after CHILD_GRACE_S. What it left in the store is then
# removed by its pid (every temp file the store writes is `.<name>.tmp-<pid>...`), and its
# flocks died with it. Committed files are only ever renamed into place.
def run_in_child(store: Callable[[Path], Any], root: Path, spec: Any, backend: str,
                 options: Any, rebuild: str | None, validate: bool, cancel: threading.Event
                 ) -> tuple[bool, str | None]:
    """`store(root).prepare(...)` in a child process; (reused, reason) of what it did. Raises
    the child's error, or BuildCancelled (after killing it and removing its leftovers) on
    `cancel`."""
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, name="stgcnd-build", daemon=True,
                       args=(sender, store, str(root), spec, backend, options, rebuild,
                             validate, logging_config()))
    t0 = time.monotonic()
    proc.start()
    sender.close()  # the child holds the only writer: EOF on the receiver if it dies
    result: tuple[Any, ...] | None = None
    try:
        while result is None:
            if cancel.is_set():
                break
            if receiver.poll(POLL_S):
                try:
                    result = receiver.recv()
                except EOFError:
                    break  # died without an answer
    finally:
        if result is None:
            _stop_child(proc)
        else:
            proc.join()
        receiver.close()
    assert proc.pid is not None
    if result is None or result[0] == "cancelled":
        removed = remove_leftovers(Path(root), proc.pid)
        if cancel.is_set() or (result is not None and result[0] == "cancelled"):
            log.warning("engine_build_cancelled", backend=backend, pid=proc.pid,
                        seconds=round(time.monotonic() - t0, 2), removed=removed)
            raise BuildCancelled("the engine build was cancelled")
        # Recorded as a failed attempt by the store (engines/retry.py), not rebuilt at every
        # restart for minutes.
        raise BuildProcessDied(
            f"the {backend} engine build process died ({_exit_reason(proc)}) without a "
            "result; the store is unchanged. See the log above; a killed build is often the "
            "out-of-memory killer: close other programs or lower max_batch / workspace",
            pid=proc.pid, how=_exit_reason(proc))
    if result[0] == "error":
        raise result[1]
    return bool(result[1]), result[2]


def _exit_reason(proc: Any) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
