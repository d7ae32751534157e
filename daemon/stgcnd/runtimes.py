"""The optional inference runtimes, imported in one place with errors that say how to get them.

Torch-free on purpose: the TensorRT serving path imports this and must not pay for torch.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from stgcnd.errors import BackendUnavailable


def import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise BackendUnavailable("onnxruntime is not installed; pip install "
                                 "'stgcnd[onnxruntime]' (or onnxruntime-gpu for CUDA)") from None
    return onnxruntime


def import_tensorrt() -> Any:
    """The `tensorrt` module; any release (callers check the API they need)."""
    try:
        import tensorrt
    except ImportError as exc:
        raise BackendUnavailable(
            f"tensorrt is not importable ({exc}); on a Jetson use a venv made with "
            "--system-site-packages so that JetPack's tensorrt is visible") from None
    return tensorrt


# --- the one TensorRT logger ------------------------------------------------------------------
#
# TensorRT keeps a single logger pointer per process: the logger of the first Builder or Runtime
# is used for everything after it (8.x warns when another one is passed), so a builder and a
# runtime with loggers of their own would route messages unpredictably. stgcnd makes exactly
# one, routes TensorRT's messages into the structured JSON log, and keeps recent errors so that
# a failed build or load can say why.

# TensorRT severity name -> structlog method. VERBOSE is dropped (thousands of lines per build)
# and INFO goes to debug: both are for `--log-level debug` sessions, not the journal.
TENSORRT_SEVERITY_LEVELS = {"INTERNAL_ERROR": "critical", "ERROR": "error",
                            "WARNING": "warning", "INFO": "debug", "VERBOSE": None}
_tensorrt_logger: Any = None
_tensorrt_logger_lock = threading.Lock()


def severity_name(severity: Any) -> str:
    """'ERROR' for trt.ILogger.Severity.ERROR (pybind11 enums have .name; str() otherwise)."""
    return str(getattr(severity, "name", str(severity).rsplit(".", 1)[-1]))


def tensorrt_logger(trt: Any = None) -> Any:
    """The process's one TensorRT ILogger, created on first use (thread-safe)."""
    global _tensorrt_logger
    with _tensorrt_logger_lock:
        if _tensorrt_logger is None:
            _tensorrt_logger = _make_tensorrt_logger(trt if trt is not None
                                                     else import_tensorrt())
        return _tensorrt_logger


def _make_tensorrt_logger(trt: Any) -> Any:
    from stgcnd.log import get_logger

    log = get_logger("stgcnd.tensorrt")

    class StructuredTensorRTLogger(trt.ILogger):  # type: ignore[misc, valid-type]
        """Routes TensorRT messages to stgcnd's log as `tensorrt_log` events."""

        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: collections.deque[str] = collections.deque(maxlen=64)
            self.error_count = 0  # monotonic: callers take a mark, then errors_since(mark)

        def log(self, severity: Any, msg: str) -> None:
            name = severity_name(severity)
            level = TENSORRT_SEVERITY_LEVELS.get(name, "info")
            if level in ("critical", "error"):
                self.errors.append(msg)
                self.error_count += 1
            if level is not None:
                getattr(log, level)("tensorrt_log", severity=name.lower(), message=msg)

        def errors_since(self, mark: int) -> list[str]:
            """Errors logged after `mark` (an earlier `error_count`), oldest first."""
            n = min(self.error_count - mark, len(self.errors))
            return list(self.errors)[len(self.errors) - n:] if n > 0 else []

    return StructuredTensorRTLogger()
