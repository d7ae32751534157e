"""Fixtures for the client library tests."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CLIENTS_DIR = Path(__file__).resolve().parents[2] / "clients"
# Import the package from the source tree: an editable install made before the package had an
# __init__.py maps it as a namespace package, which would hide stgcnd_client's exports.
if str(CLIENTS_DIR) not in sys.path:
    sys.path.insert(0, str(CLIENTS_DIR))

from client_fakes import FakeDaemon, FakeModelServer, Handler


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "d.sock"
    short_dir = None
    if len(str(path)) > 90:  # ipc paths must fit in sockaddr_un (~107 bytes)
        short_dir = tempfile.mkdtemp(prefix="stgc")
        path = Path(short_dir) / "d.sock"
    yield f"ipc://{path}"
    if short_dir:
        shutil.rmtree(short_dir, ignore_errors=True)


@pytest.fixture
def serve(endpoint: str) -> Iterator[Callable[[Handler | None], FakeDaemon]]:
    """serve(handler=None) starts a FakeDaemon on the test's endpoint (default: the fake model)."""
    started: list[FakeDaemon] = []

    def start(handler: Handler | None = None) -> FakeDaemon:
        daemon = FakeDaemon(endpoint, handler or FakeModelServer()).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()
