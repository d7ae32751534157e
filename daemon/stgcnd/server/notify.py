"""The systemd notify protocol: one datagram per message to $NOTIFY_SOCKET (a leading '@'
is the abstract namespace); without it every call is a no-op."""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        addr = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if addr.startswith("@"):
            self.address = "\0" + addr[1:]
        elif addr.startswith("/"):
            self.address = addr
        self._sock: socket.socket | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_usec = int(usec) if usec.isdigit() and (
            not pid or pid == str(os.getpid())) else 0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings: half of systemd's timeout, as sd_watchdog advises."""
        return self.watchdog_usec / 2e6 if self.watchdog_usec else None

    def send(self, **fields: object) -> bool:
        """Send KEY=value lines, e.g. send(READY=1, STATUS="serving"). False if not sent."""
        if self.address is None:
            return False
        msg = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(msg, self.address)
            return True
        except OSError:
            return False  # systemd gone or socket not ours: nothing useful to do

    def ready(self, status: str) -> bool:
        return self.send(READY=1, STATUS=status)

    def reloading(self) -> bool:
        return self.send(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(
            time.CLOCK_MONOTONIC) // 1000)

    def stopping(self, status: str = "draining") -> bool:
        return self.send(STOPPING=1, STATUS=status)

    def status(self, text: str) -> bool:
        return self.send(STATUS=text)

    def extend_timeout(self, seconds: float) -> bool:
        return self.send(EXTEND_TIMEOUT_USEC=int(seconds * 1e6))

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
