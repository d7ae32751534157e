"""Rate-limited logging of clients' bad requests: a hostile or broken camera must not flood
the log (or the journal) any more than it can slow the daemon."""

from __future__ import annotations

import time

from stgcnd.log import get_logger

log = get_logger(__name__)

ERROR_LOG_WINDOW_S = 10.0


class ClientErrorLog:
    """Log a client's bad requests once per window, then how many were suppressed."""

    def __init__(self) -> None:
        self._state: dict[str, tuple[float, int]] = {}

    def report(self, client: str, code: str, message: str) -> None:
        now = time.monotonic()
        since, suppressed = self._state.get(client, (0.0, 0))
        if now - since >= ERROR_LOG_WINDOW_S:
            if suppressed:
                log.warning("client_error_suppressed", client=client, count=suppressed)
            log.warning("request_rejected", client=client, code=code, message=message)
            self._state[client] = (now, 0)
        else:
            self._state[client] = (since, suppressed + 1)
        if len(self._state) > 10_000:  # bounded memory under identity churn
            self._state.clear()
