"""Client library for stgcnd, the ST-GCN skeleton action recognition daemon.

Needs only pyzmq, msgpack and numpy (``pip install ./clients``). One `Client` per camera
thread; `SkeletonWindow` turns pose landmarks into windows; the wire protocol is
`stgcnd_client.protocol` and docs/protocol.md.
"""

from __future__ import annotations

from .client import Client
from .errors import (
    BadReply,
    Busy,
    ClientClosed,
    ClientError,
    CrossThreadUse,
    Expired,
    Forbidden,
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
    "Expired",
    "Forbidden",
    "ModelInfo",
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
