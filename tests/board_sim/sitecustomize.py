"""A simulated Jetson Orin NX 8 GB on JetPack 5.1.2, and a Python without torch, for a
daemon started by a test.

Python imports `sitecustomize` at start-up from the path: a test puts this directory on
PYTHONPATH and describes the board in $BOARD_SIM (JSON), so that the daemon and the build
child it spawns (a fresh interpreter) both run on it. What is simulated is only what this
machine lacks: the board's files (L4T release, model, memory), a GPU answering the driver with
the Orin's name and free memory, and a TensorRT 8.5.2 whose build, engine load or execution
context fails the way it fails on a board out of memory. Everything else is real: the daemon,
its fallback to the next runtime, ONNX Runtime or torch on the CPU, the sockets.
"""

import json
import os
import sys

if os.environ.get("SIM_NO_TORCH"):
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises

_SPEC = os.environ.get("BOARD_SIM")
if _SPEC:
    from tests.board_sim.board import install

    install(json.loads(_SPEC))
