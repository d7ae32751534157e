"""Client library for stgcnd, the ST-GCN skeleton action recognition daemon.

Needs only pyzmq, msgpack and numpy, so camera pipelines can install it on their own
(``pip install ./clients``). One `Client` per camera thread::

    from stgcnd_client import Client, SkeletonWindow

    window = SkeletonWindow(frames=150, persons=1)
    with Client("ipc:///run/stgcnd/stgcnd.sock", camera_id="aisle-3") as client:
        for landmarks in camera:                 # MediaPipe pose landmarks per frame
            frame = window.frame(landmarks)      # (3, V, M) float32
            result = client.push(frame)          # None until the server's window is full
            if result is not None:
                print(result.label_name, result.probs)

The wire protocol lives in `stgcnd_client.protocol` (also used by the daemon) and
docs/protocol.md.
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
