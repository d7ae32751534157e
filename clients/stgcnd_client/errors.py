"""Exceptions the client raises. Catch `ClientError` for all of them.

Server-side failures are `ServerError` (with the protocol's stable ``.code``); the common ones a
camera loop reacts to differently have their own subclasses: `Busy` (not run: see its reason),
`Expired` (the answer would have come too late) and `ShuttingDown` (back off and reconnect later).
"""

from __future__ import annotations

from .protocol import ErrorCode


class ClientError(Exception):
    """Base class of everything stgcnd_client raises on purpose."""


class Timeout(ClientError):
    """No reply within the call's deadline, after reconnecting and resending."""


class ClientClosed(ClientError):
    """The client was closed; create a new one."""


class CrossThreadUse(ClientError):
    """A Client was used from two threads; ZeroMQ sockets are not thread-safe."""


class EventsGap(ClientError):
    """`Events`: messages were lost (a slow subscriber past the daemon's queue), or the daemon
    restarted. ``missed``: how many (None: a restart, whose end is not known). A snapshot of
    the open events follows: forget what you believed open, and go on reading."""

    def __init__(self, message: str, missed: int | None) -> None:
        super().__init__(message)
        self.missed = missed


class NoHeartbeat(ClientError):
    """`Events`: nothing from the daemon for longer than its heartbeats allow: it stopped, or
    the network between is down (the socket keeps reconnecting: reading on waits for it)."""


class BadReply(ClientError):
    """The server's reply does not follow the protocol this client speaks."""


class ServerError(ClientError):
    """The server answered with an error. ``code`` is one of `ErrorCode`'s values.

    ``reason``: why a `busy` or `shutting-down` was refused (`Reason`'s values), else None.
    ``appended``: for a push, whether its frame is in the camera's window on the server (a
    resend with the same id never appends it twice); None for other ops, or when the server
    could not decode the request (then it was not appended).
    """

    def __init__(self, code: str, message: str, reason: str | None = None,
                 appended: bool | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.appended = appended


class Busy(ServerError):
    """Not run; what its ``reason`` means and what to do: docs/protocol.md, "The `busy` reply"."""


class Expired(ServerError):
    """The daemon could not answer within the call's `timeout` and did not run the request.

    Raised only once an attempt that had all of the call's remaining time was refused: an
    `expired` answer with time left is retried first (stgcnd_client.client). The message
    gives the call's timeout in seconds and the daemon's reason."""


class ShuttingDown(ServerError):
    """The server is stopping and no longer takes requests."""


class Forbidden(ServerError):
    """This client's CURVE key is bound to other camera ids than the one asked for."""


_BY_CODE: dict[str, type[ServerError]] = {
    ErrorCode.BUSY.value: Busy,
    ErrorCode.EXPIRED.value: Expired,
    ErrorCode.SHUTTING_DOWN.value: ShuttingDown,
    ErrorCode.FORBIDDEN.value: Forbidden,
}


def server_error(code: str, message: str, reason: str | None = None,
                 appended: bool | None = None) -> ServerError:
    """The exception instance for an error reply with this code."""
    return _BY_CODE.get(code, ServerError)(code, message, reason, appended)
