"""The floor under stgcnd's round trip: bare ZeroMQ over ipc between two Python processes.

    python3 scripts/zmq_echo_floor.py [N]

A DEALER sends what a window request is on the wire (a small header frame and one M=1
window, 59,400 bytes) to a ROUTER in another process that answers a 60-byte frame at once;
prints the round trip's p50 / p90 / p99. The daemon's overhead (round trip minus compute)
cannot go below this on the same machine: both ends pay ZeroMQ's I/O threads and the ipc
socket, with no decoding, checking or inference in between.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq


def serve(endpoint: str) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    reply = b"r" * 60
    while True:
        msg = router.recv_multipart(copy=False)
        router.send_multipart([msg[0].bytes, reply])
        if len(msg) == 2 and msg[1].bytes == b"stop":
            break
    router.close(0)
    ctx.term()


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
        return 0
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    endpoint = f"ipc://{Path(tempfile.mkdtemp()) / 'echo.sock'}"
    server = subprocess.Popen([sys.executable, __file__, "--serve", endpoint])
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    request = [b"h" * 90, np.zeros((3, 150, 33, 1), np.float32).tobytes()]
    times = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            dealer.send_multipart(request)
            dealer.recv_multipart()
            times.append(time.perf_counter() - t0)
    finally:
        dealer.send_multipart([b"stop"])
        dealer.recv_multipart()
        server.wait(10)
        dealer.close(0)
        ctx.term()
    ms = np.array(times[n // 10:]) * 1e3  # the first tenth warms up
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    print(f"zmq ipc echo, {len(request[1])}-byte request: p50 {p50:.3f} / p90 {p90:.3f} / "
          f"p99 {p99:.3f} ms over {len(ms)} round trips")
    return 0


if __name__ == "__main__":
    sys.exit(main())
