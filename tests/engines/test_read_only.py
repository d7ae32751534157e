"""A pre-built engine store on a read-only filesystem serves; a build it needs is one clear
error (issue #12.7). The store is made truly read-only for the process (see readonly.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.engines.conftest import FRAMES, REPO, named
from tests.engines.readonly import prefixed, read_only
from tests.engines.test_store import ART, paths

PRELUDE = "from stgcnd.log import configure_logging\nconfigure_logging('info', 'json')\n"

PREPARE = """
from pathlib import Path
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.errors import UserError
from stgcnd.model.spec import ModelSpec
try:
    a = EngineStore(Path({root!r})).prepare(ModelSpec(frames={frames}), "onnxruntime",
                                            BuildOptions(), rebuild={rebuild!r})
    print("OK", a.reused, a.reason)
except UserError as e:
    print("USERERROR", type(e).__name__, e)
"""


def _prepare_read_only(root, rebuild=None) -> subprocess.CompletedProcess:
    code = PRELUDE + PREPARE.format(root=str(root), frames=FRAMES, rebuild=rebuild)
    with read_only(root) as prefix:
        return subprocess.run(prefixed(prefix, [sys.executable, "-c", code]), cwd=REPO,
                              capture_output=True, text=True, timeout=300)


def _files(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*"))


def test_current_artefacts_are_reused_on_a_read_only_store(store_root):
    before = _files(store_root)
    r = _prepare_read_only(store_root)
    assert r.stdout.split() == ["OK", "True", "None"], r.stdout + r.stderr
    ro = named(r.stderr, "engine_store_read_only")
    assert len(ro) == 1 and ro[0]["error"] in ("Read-only file system", "Permission denied")
    assert ro[0]["locked"] is True  # the existing lock file is flocked read-only
    assert named(r.stderr, "engine_reused")
    assert _files(store_root) == before


def test_reused_without_any_lock_file(store_root):
    """A store copied without its .locks directory: nothing to lock, nobody can write."""
    mdir = paths(store_root)[0].parent
    shutil.rmtree(mdir / ".locks")
    r = _prepare_read_only(store_root)
    assert r.stdout.split() == ["OK", "True", "None"], r.stdout + r.stderr
    assert named(r.stderr, "engine_store_read_only")[0]["locked"] is False
    assert not (mdir / ".locks").exists()


def _assert_one_clear_line(r: subprocess.CompletedProcess, reason: str) -> str:
    out = r.stdout.strip()
    assert out.startswith("USERERROR StoreReadOnly "), r.stdout + r.stderr
    assert len(out.splitlines()) == 1 and "Traceback" not in r.stderr
    assert "read-only" in out and reason in out
    assert "stgcnd build" in out and "engines_dir" in out  # both ways to fix it
    return out


def test_missing_artefact_on_a_read_only_store_is_one_clear_error(store_root):
    art, manifest_path, _ = paths(store_root)
    art.unlink()
    manifest_path.unlink()
    _assert_one_clear_line(_prepare_read_only(store_root), "(missing)")
    assert not list(art.parent.glob(f".{ART}*"))


def test_forced_rebuild_on_a_read_only_store_is_one_clear_error(store_root):
    art, _, _ = paths(store_root)
    before = art.read_bytes()
    _assert_one_clear_line(_prepare_read_only(store_root, rebuild="failed to load: test"),
                           "failed to load: test")
    assert art.read_bytes() == before


def test_store_root_missing_on_a_read_only_filesystem(tmp_path):
    (tmp_path / "ro").mkdir()
    r = _prepare_read_only_root(tmp_path / "ro", tmp_path / "ro" / "engines")
    _assert_one_clear_line(r, "missing")


def _prepare_read_only_root(ro_dir, root) -> subprocess.CompletedProcess:
    code = PRELUDE + PREPARE.format(root=str(root), frames=FRAMES, rebuild=None)
    with read_only(ro_dir) as prefix:
        return subprocess.run(prefixed(prefix, [sys.executable, "-c", code]), cwd=REPO,
                              capture_output=True, text=True, timeout=300)
