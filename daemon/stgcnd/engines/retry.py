"""When a failed build is tried again: a failure remembers why and how much memory was free.

On a Jetson a TensorRT build usually fails for a passing reason: the cameras held memory at
that moment, or the out-of-memory killer took the build process. Refusing it forever would
leave the board on the CPU until someone runs `stgcnd build --rebuild`; retrying at every
start would spend minutes each systemd restart. So a failure's record (`<stem>.failed.json`,
engines/build.py) holds the error, the free memory when that build started and the attempts
so far, and the same build is tried again when `MORE_FREE` times that memory is free now, or
`after_s` (`build_retry_after_s`) has passed, at most `attempts` (`build_attempts`) times in
all; after that it sticks until the configuration, the versions or the device change, or
`stgcnd build --rebuild`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

MB = 1 << 20
MORE_FREE = 1.25  # 25% more free memory than when it failed


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass(frozen=True)
class BuildRetry:
    after_s: float = 3600.0
    attempts: int = 3

    def why_now(self, record: dict[str, Any], free_now: int | None, now: float
                ) -> str | None:
        """Why the failed build of `record` is tried again now, or None (not yet, or not
        any more)."""
        if int(record.get("attempts", 1)) >= self.attempts:
            return None
        free_then = record.get("free_bytes")
        if free_now is not None and isinstance(free_then, int) and \
                free_now >= free_then * MORE_FREE:
            return (f"{free_now // MB} MB free now, {free_then // MB} MB when it failed")
        failed = float(record.get("failed_at_s", 0))
        if now >= failed + self.after_s:
            return f"{now - failed:.0f} s since it failed (build_retry_after_s {self.after_s:g})"
        return None

    def when(self, record: dict[str, Any]) -> dict[str, Any]:
        """When it will be tried again, for a log line and the refusal: {} when never."""
        attempts = int(record.get("attempts", 1))
        if attempts >= self.attempts:
            return {}
        free_then = record.get("free_bytes")
        return {"retry_after": iso(float(record.get("failed_at_s", 0)) + self.after_s),
                "retry_when_free_mb": (int(free_then * MORE_FREE) // MB
                                       if isinstance(free_then, int) else None),
                "attempts": attempts, "max_attempts": self.attempts}

    def describe(self, record: dict[str, Any]) -> str:
        """The refusal's last sentence: when, or how, it is built again."""
        when = self.when(record)
        if not when:
            return (f"It failed {record.get('attempts', 1)} time(s), the most "
                    f"build_attempts allows")
        free = (f" or once {when['retry_when_free_mb']} MB are free"
                if when["retry_when_free_mb"] is not None else "")
        return (f"Trying it again at a start after {when['retry_after']}{free} (attempt "
                f"{when['attempts'] + 1} of {self.attempts})")
