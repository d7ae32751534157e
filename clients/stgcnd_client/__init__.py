"""Client library for stgcnd, the ST-GCN skeleton action recognition daemon.

Needs only pyzmq, msgspec and numpy (``pip install ./clients``). One `Client` per camera
thread; `SkeletonWindow` turns pose landmarks into windows; the wire protocol is
`stgcnd_client.protocol` and docs/protocol.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ below imports them
    from .client import Client
    from .errors import (
        BadReply,
        Busy,
        ClientClosed,
        ClientError,
        CrossThreadUse,
        EventsGap,
        Expired,
        Forbidden,
        NoHeartbeat,
        ServerError,
        ShuttingDown,
        Timeout,
    )
    from .events import Events
    from .protocol import PROTOCOL_VERSION, ErrorCode, Op, ProtocolError, Reason
    from .results import ModelInfo, Result, ServerInfo
    from .window import SkeletonWindow

__version__ = "0.1.0"

__all__ = [
    "PROTOCOL_VERSION",
    "BadReply",
    "Busy",
    "Client",
    "ClientClosed",
    "ClientError",
    "CrossThreadUse",
    "ErrorCode",
    "Events",
    "EventsGap",
    "Expired",
    "Forbidden",
    "ModelInfo",
    "NoHeartbeat",
    "Op",
    "ProtocolError",
    "Reason",
    "Result",
    "ServerError",
    "ServerInfo",
    "ShuttingDown",
    "SkeletonWindow",
    "Timeout",
    "__version__",
]

# The module of each public name. They are imported when first asked for (PEP 562): the
# daemon imports `stgcnd_client.protocol` and `.endpoint` alone, and must not pay for the
# client, the window builder and the rest (~1,100 lines) that `import stgcnd_client` would
# otherwise load.
_WHERE = {"Client": "client", "Events": "events", "SkeletonWindow": "window",
          **dict.fromkeys(("BadReply", "Busy", "ClientClosed", "ClientError", "CrossThreadUse",
                           "EventsGap", "Expired", "Forbidden", "NoHeartbeat", "ServerError",
                           "ShuttingDown", "Timeout"),
                          "errors"),
          **dict.fromkeys(("PROTOCOL_VERSION", "ErrorCode", "Op", "ProtocolError", "Reason"),
                          "protocol"),
          **dict.fromkeys(("ModelInfo", "Result", "ServerInfo"), "results")}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
