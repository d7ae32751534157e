"""Cancellable builds (issue #12.9) at the store level: a real spawned build process.
The daemon-level test (SIGTERM mid-build) is tests/server/test_startup_daemon.py."""

from __future__ import annotations

import os
import threading
import time

import pytest

from stgcnd.engines.child_build import remove_leftovers
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.errors import BuildCancelled, UserError
from tests.engines.conftest import demo_spec
from tests.engines.pausing_store import PAUSE_VAR, PausingStore
from tests.engines.test_store import paths


def test_build_in_a_child_process_commits_and_reports(store_root):
    art, manifest_path, _ = paths(store_root)
    art.unlink()
    manifest_path.unlink()
    a = EngineStore(store_root, cancel=threading.Event()).prepare(demo_spec(), "onnxruntime")
    assert not a.reused and a.reason == "missing" and a.path == art and art.exists()
    assert a.manifest["sha256"]
    # Current now: found in-process, nothing spawned.
    t0 = time.monotonic()
    b = EngineStore(store_root, cancel=threading.Event()).prepare(demo_spec(), "onnxruntime")
    assert b.reused and time.monotonic() - t0 < 5


def test_child_errors_come_back_as_they_were(store_root):
    """A UserError raised in the build process reaches the caller with its type and text."""
    blocker = store_root / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(UserError, match="Not a directory"):
        EngineStore(blocker / "engines", cancel=threading.Event()).prepare(
            demo_spec(), "onnxruntime")


def test_cancel_set_before_asking_builds_nothing(store_root):
    art, manifest_path, _ = paths(store_root)
    art.unlink()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(BuildCancelled):
        EngineStore(store_root, cancel=cancel).prepare(demo_spec(), "onnxruntime")
    assert not art.exists()


def test_cancel_mid_build_kills_the_child_and_removes_its_files(store_root, monkeypatch):
    art, manifest_path, _ = paths(store_root)
    old_manifest = manifest_path.read_text()
    # The child holds its written temp artefact for 60 s before it would validate and commit,
    # so the cancel below always lands mid-build. (Without the pause, a fast CPU build could
    # commit between the watcher seeing the temp file and setting the event: CI saw that.)
    monkeypatch.setenv(PAUSE_VAR, "60")
    cancel = threading.Event()
    store = PausingStore(store_root, cancel=cancel)

    def cancel_when_writing() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end and not list(art.parent.glob(f".{art.stem}.tmp-*")):
            time.sleep(0.05)
        cancel.set()

    watcher = threading.Thread(target=cancel_when_writing, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    with pytest.raises(BuildCancelled):
        store.prepare(demo_spec(), "onnxruntime", BuildOptions(), rebuild="test: forced")
    watcher.join()
    assert time.monotonic() - t0 < 60  # the pause was cut short, not waited out
    assert not list(store_root.rglob(".*.tmp-*"))
    assert manifest_path.read_text() == old_manifest  # the old artefact is still the one
    monkeypatch.delenv(PAUSE_VAR)
    assert EngineStore(store_root).prepare(demo_spec(), "onnxruntime").reused


def test_remove_leftovers_only_touches_that_pid(tmp_path):
    mine = tmp_path / "m" / ".x.onnx.tmp-4242.abc.part"
    others = [tmp_path / "m" / f".x.onnx.tmp-{os.getpid()}.onnx",
              tmp_path / "m" / ".x.onnx.tmp-42421.onnx", tmp_path / "m" / "x.onnx"]
    mine.parent.mkdir()
    for f in (mine, *others):
        f.write_text("")
    assert remove_leftovers(tmp_path, 4242) == [str(mine)]
    assert all(f.exists() for f in others) and not mine.exists()
