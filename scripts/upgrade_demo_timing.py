"""Serve at once, upgrade in place (#45), measured: the int8 ONNX Runtime demo on a cold store
against the fp32 one, alternated. For each trial: seconds from the daemon's spawn to READY
(sd_notify), then, for int8, to the first `hello` whose `serving` is int8; a camera infer-ing
every 0.2 s from READY on, its errors and the client's resends (a reply later than an
attempt's share of the timeout) counted.

    PYTHONPATH=daemon:clients python scripts/upgrade_demo_timing.py --trials 2

The background build runs at idle priority, as in production: on a CPU that other work keeps
busy it gets only what is left, which is the point (the figure says how long that took here).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from stgcnd.model.synthetic import synthetic_windows
from stgcnd_client import Client

CONFIG = """[server]
endpoint = "ipc://{dir}/d.sock"
engines_dir = "{dir}/engines"

[[models]]
name = "demo"
demo = true
backend = "onnxruntime"
device = "cpu"
precision = "{precision}"
allow_synthetic_calibration = true
"""


def trial(precision: str, wait_upgrade_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="stgcnd-upgrade-") as tmp:
        config = Path(tmp) / "stgcnd.toml"
        config.write_text(CONFIG.format(dir=tmp, precision=precision))
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(f"{tmp}/notify.sock")
        notify.settimeout(0.5)
        env = {**os.environ, "NOTIFY_SOCKET": f"{tmp}/notify.sock"}
        log_path = Path(tmp) / "daemon.log"
        t0 = time.monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "stgcnd", "--log-format", "json",
                                     "serve", "--config", str(config)], stdout=log,
                                    stderr=subprocess.STDOUT, env=env)
        try:
            while b"READY=1" not in _recv(notify):
                if proc.poll() is not None or time.monotonic() - t0 > 300:
                    raise SystemExit(f"no READY; log:\n{log_path.read_text()[-3000:]}")
            ready_s = time.monotonic() - t0
            upgraded_s = None
            with Client(f"ipc://{tmp}/d.sock", camera_id="probe") as probe:
                _, frames, joints, persons = probe.hello().models[0].input_shape
                camera = Camera(f"ipc://{tmp}/d.sock",
                                synthetic_windows(1, frames, persons, joints, seed=3)[0])
                camera.start()
                end = time.monotonic() + (wait_upgrade_s if precision != "fp32" else 10)
                while time.monotonic() < end:
                    serving = probe.hello().models[0].extra.get("serving") or {}
                    if precision != "fp32" and serving.get("precision") == precision:
                        upgraded_s = time.monotonic() - t0
                        break
                    time.sleep(1.0)
            time.sleep(3.0 if precision != "fp32" else 0)  # the camera goes on after the swap
            camera.stop()
            events = [json.loads(line) for line in log_path.read_text().splitlines()
                      if line.startswith("{")]
            upgraded = [e for e in events if e.get("event") == "model_upgraded"]
            return {"precision": precision, "ready_s": round(ready_s, 1),
                    "serving_int8_s": None if upgraded_s is None else round(upgraded_s, 1),
                    "infers_ok": camera.ok, "errors": camera.errors[:3],
                    "error_count": len(camera.errors), "resends": camera.resends,
                    "model_upgraded": upgraded[0] if upgraded else None}
        finally:
            proc.terminate()
            proc.wait(60)
            notify.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(4096)
    except socket.timeout:
        return b""


class Camera(threading.Thread):
    """A camera infer-ing every 0.2 s; errors are what its caller would see."""

    def __init__(self, endpoint: str, window: object) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.window = endpoint, window
        self.ok, self.errors, self.resends = 0, [], 0  # type: ignore[var-annotated]
        self._halt = threading.Event()

    def run(self) -> None:
        with Client(self.endpoint, camera_id="cam") as client:
            while not self._halt.wait(0.2):
                try:
                    client.infer(self.window)
                    self.ok += 1
                except Exception as exc:  # counted and reported: the figure is how many
                    self.errors.append(repr(exc))
            self.resends = client.reconnects

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--wait-upgrade-s", type=float, default=300.0)
    args = parser.parse_args()
    print(json.dumps({"loadavg": os.getloadavg(), "cpus": os.cpu_count()}), flush=True)
    for _ in range(args.trials):
        for precision in ("fp32", "int8"):
            print(json.dumps({**trial(precision, args.wait_upgrade_s),
                              "loadavg": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
