"""Rate-limited logging of what clients do wrong, keyed by kind (an error code, a dropped
reply, a crash), never by camera or client identity: both are the client's to invent."""

from __future__ import annotations

import time
from typing import Any

from stgcnd.log import get_logger

log = get_logger(__name__)

ERROR_LOG_WINDOW_S = 10.0


class ClientErrorLog:
    """Log the first event of each kind per window, then how many of that kind were
    suppressed in it (with the number of distinct cameras, to tell one abuser from many)."""

    def __init__(self, window_s: float = ERROR_LOG_WINDOW_S) -> None:
        self.window_s = window_s
        self._since: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._cameras: dict[str, set[str]] = {}

    def report(self, kind: str, event: str = "request_rejected", camera: str | None = None,
               fault: bool = False, **fields: Any) -> None:
        """`fault`: the daemon's own bug, not the client's mistake: logged at error."""
        now = time.monotonic()
        since = self._since.get(kind)
        if since is None or now - since >= self.window_s:
            self.flush(kind)
            self._since[kind] = now
            (log.error if fault else log.warning)(event, code=kind, camera=camera, **fields)
            return
        self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
        cams = self._cameras.setdefault(kind, set())
        if camera is not None and len(cams) < 1000:  # bounded under camera-id churn
            cams.add(camera)

    def flush(self, kind: str | None = None) -> None:
        """Log the suppressed counts (of one kind, or all)."""
        for k in [kind] if kind is not None else list(self._suppressed):
            count = self._suppressed.pop(k, 0)
            cams = self._cameras.pop(k, set())
            if count:
                log.warning("client_error_suppressed", code=k, count=count,
                            cameras=len(cams), window_s=self.window_s)
