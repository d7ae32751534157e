"""The engine store with a backend that runs here (ONNX Runtime), in real processes."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from stgcnd.commands.build import describe
from stgcnd.engines.keys import key_digest
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import BUILT_HERE, EngineStore
from stgcnd.errors import UserError
from tests.conftest import NARROW, write_checkpoint
from tests.engines.conftest import (
    FRAMES,
    REPO,
    demo_spec,
    named,
    prepare_code,
    run_python,
)
from tests.engines.pausing_store import PAUSE_VAR, RELEASE_VAR

ART = "onnxruntime-fp32-cpu-b1"


def paths(root: Path, spec=None) -> tuple[Path, Path, Path]:
    mdir = EngineStore(root).model_dir(spec or demo_spec())
    return mdir / f"{ART}.onnx", mdir / f"{ART}.json", mdir / "onnx" / "model-b1.onnx"


def stat_of(*files: Path) -> list[tuple[int, int]]:
    return [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_writes_artefact_manifest_and_onnx(store_root):
    art, manifest_path, onnx = paths(store_root)
    m = json.loads(manifest_path.read_text())
    assert m["sha256"] == sha(art) and m["size_bytes"] == art.stat().st_size
    assert m["key"] == key_digest(m["key_parts"])
    assert m["key_parts"]["onnx_sha256"] == sha(onnx)
    import onnxruntime

    assert m["key_parts"]["backend_version"] == onnxruntime.__version__
    assert m["input_shape"] == [3, FRAMES, 33, 1] and m["num_class"] == 2
    assert m["validation"]["windows"] > 0 and m["validation"]["max_abs_diff"] < 1e-4
    assert not list(art.parent.glob(".*tmp-*"))


def test_reuse_rewrites_nothing(store_root):
    art, manifest_path, onnx = paths(store_root)
    before = stat_of(art, manifest_path, onnx)
    with capture_logs() as logs:
        a = EngineStore(store_root).prepare(demo_spec(), "onnxruntime", BuildOptions())
    assert a.reused and a.reason is None and a.path == art
    assert stat_of(art, manifest_path, onnx) == before
    assert [e["event"] for e in logs if e["event"].startswith("engine_")] == ["engine_reused"]
    # Runtime-only options are not part of the key: still reused.
    b = EngineStore(store_root).prepare(demo_spec(), "onnxruntime", BuildOptions(threads=1))
    assert b.reused


def test_find_without_torch(store_root):
    """The TensorRT path looks artefacts up from a spec without importing torch."""
    art, _, _ = paths(store_root)
    code = f"""
import sys
from pathlib import Path
from types import SimpleNamespace
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
spec = SimpleNamespace(checkpoint=None, seed={demo_spec().seed}, num_class=2, strategy="spatial",
    two_stream=True, layout="mediapipe", persons=1, frames={FRAMES}, motion="first-difference",
    graph_op="matmul", input_shape=(3, {FRAMES}, 33, 1))
a = EngineStore(Path({str(store_root)!r})).find(spec, "onnxruntime", BuildOptions())
print(a.path if a else None, sys.modules.get("torch") is not None)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(art), "False"]


def test_truncated_artefact_is_rebuilt(store_root):
    art, _manifest_path, _ = paths(store_root)
    good = sha(art)
    with open(art, "r+b") as f:
        f.truncate(art.stat().st_size // 2)
    store = EngineStore(store_root)
    assert store.find(demo_spec(), "onnxruntime") is None
    assert store.list()[0]["status"].startswith("corrupt")
    with capture_logs() as logs:
        a = store.prepare(demo_spec(), "onnxruntime", BuildOptions())
    assert not a.reused and "corrupt" in a.reason and "truncated" in a.reason
    assert [e["reason"] for e in logs if e["event"] == "engine_rebuilt"] == [a.reason]
    assert sha(art) == good  # ONNX Runtime's optimized model is deterministic


def test_unreadable_manifest_is_rebuilt(store_root):
    _, manifest_path, _ = paths(store_root)
    manifest_path.write_text("{not json")
    a = EngineStore(store_root).prepare(demo_spec(), "onnxruntime", BuildOptions())
    assert not a.reused and a.reason == "corrupt: manifest unreadable"
    assert json.loads(manifest_path.read_text())["backend"] == "onnxruntime"


@pytest.mark.parametrize("where, value, expect", [
    (("backend_version",), "0.0.1", "backend_version: 0.0.1 -> "),
    (("device", "machine"), "riscv64", "device.machine: riscv64 -> "),
])
def test_key_change_rebuilds_and_says_which_part(store_root, where, value, expect):
    """A store moved from another machine / runtime version: rebuilt with the reason."""
    _art, manifest_path, _ = paths(store_root)
    m = json.loads(manifest_path.read_text())
    target = m["key_parts"]
    for k in where[:-1]:
        target = target[k]
    target[where[-1]] = value
    m["key"] = key_digest(m["key_parts"])
    manifest_path.write_text(json.dumps(m))
    store = EngineStore(store_root)
    assert store.list()[0]["status"].startswith("stale")
    assert store.find(demo_spec(), "onnxruntime") is None
    a = store.prepare(demo_spec(), "onnxruntime", BuildOptions())
    assert not a.reused and a.reason.startswith("key changed: ") and expect in a.reason
    assert store.list()[0]["status"] == "current"


def test_prune_removes_stale_and_leftovers(store_root):
    art, manifest_path, onnx = paths(store_root)
    m = json.loads(manifest_path.read_text())
    m["key_parts"]["backend_version"] = "0.0.1"
    manifest_path.write_text(json.dumps(m))
    # A leftover of a killed build: pid 2**22 + 1 exceeds pid_max's default, so it is dead.
    leftover = art.parent / f".{ART}.tmp-{2**22 + 1}.onnx"
    leftover.write_bytes(b"half")
    store = EngineStore(store_root)
    dry = store.prune(dry_run=True)
    assert {Path(r["path"]) for r in dry} == {art, manifest_path, leftover}
    assert art.exists() and leftover.exists()
    store.prune()
    assert not art.exists() and not manifest_path.exists() and not leftover.exists()
    assert onnx.exists()  # the ONNX is the model's, not the stale artefact's


def test_a_changed_checkpoint_is_another_model_and_a_moved_one_the_same(tmp_path,
                                                                       two_stream_state):
    """The store keys a model by its checkpoint's content: retraining into the same file
    exports and builds anew (in its own directory, the old one kept for a rollback until
    `stgcnd engines prune`), and moving or renaming the file reuses everything."""
    from stgcnd.model.demo import demo_state_dict

    ckpt = write_checkpoint(tmp_path / "model.pt", two_stream_state)
    spec = demo_spec(checkpoint=ckpt)
    store = EngineStore(tmp_path / "engines")
    first = store.prepare(spec, "onnxruntime", BuildOptions(), validate=False)
    art, _, onnx = paths(tmp_path / "engines", spec)
    onnx_sha, art_sha = sha(onnx), sha(art)
    write_checkpoint(ckpt, demo_state_dict("mediapipe", "spatial", 2, True, seed=8, widths=NARROW))
    with capture_logs() as logs:
        second = store.prepare(spec, "onnxruntime", BuildOptions(), validate=False)
    assert first.path != second.path and not second.reused and second.reason == "missing"
    assert "onnx_exported" in [e["event"] for e in logs]
    assert sha(onnx) == onnx_sha and sha(art) == art_sha  # the first model's files kept
    assert second.manifest["key_parts"]["onnx_sha256"] != onnx_sha
    moved = tmp_path / "elsewhere" / "renamed.pt"
    moved.parent.mkdir()
    ckpt.rename(moved)
    third = store.prepare(demo_spec(checkpoint=moved), "onnxruntime", BuildOptions(),
                          validate=False)
    assert third.reused and third.path == second.path


def _spawn_build(root: Path, pause: float | None, rebuild: str | None = None,
                 release: Path | None = None) -> subprocess.Popen:
    env = {**os.environ}
    if pause is not None:
        env[PAUSE_VAR] = str(pause)
    if release is not None:
        env[RELEASE_VAR] = str(release)
    prelude = "from stgcnd.log import configure_logging\nconfigure_logging('info', 'json')\n"
    return subprocess.Popen([sys.executable, "-c", prelude + prepare_code(root, rebuild)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO)


def _wait_for_event(proc: subprocess.Popen, name: str, timeout: float = 60) -> str:
    """Read proc's stderr until event `name`; returns what was read."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if f'"event": "{name}"' in line:
            return "".join(seen)
    proc.kill()
    raise AssertionError(f"no {name} event; stderr:\n{''.join(seen)}")


def test_two_processes_build_once(seed_store, tmp_path):
    """The second process waits on the lock, then reuses what the first built."""
    import shutil

    root = tmp_path / "engines"
    shutil.copytree(seed_store, root)
    art, _manifest_path, _ = paths(root)
    art.unlink()
    release = tmp_path / "release"
    first = _spawn_build(root, pause=120, release=release)
    try:
        _wait_for_event(first, "build_test_pause")  # first holds the lock, mid-build
        second = _spawn_build(root, pause=None)
        seen2 = _wait_for_event(second, "engine_build_wait")  # second waits on the lock
    finally:
        release.touch()  # first goes on building
    out1, err1 = first.communicate(timeout=120)
    out2, err2 = second.communicate(timeout=120)
    err2 = seen2 + err2
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    assert out1.split()[1:] == ["False", "missing"]
    assert out2.split()[1:] == ["True", "None"]
    assert named(err2, "engine_build_wait") and named(err2, "engine_reused")
    assert not named(err2, "engine_build_started")


def test_sigkill_mid_build_keeps_old_artefact(store_root):
    art, manifest_path, _ = paths(store_root)
    old_bytes, old_manifest = art.read_bytes(), manifest_path.read_text()
    proc = _spawn_build(store_root, pause=30, rebuild="test: forced")
    _wait_for_event(proc, "build_test_pause")
    tmp_files = list(art.parent.glob(f".{ART}.tmp-*"))
    assert tmp_files and tmp_files[0].stat().st_size > 0  # killed with a temp file written
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert art.read_bytes() == old_bytes and manifest_path.read_text() == old_manifest
    a = EngineStore(store_root).prepare(demo_spec(), "onnxruntime", BuildOptions())
    assert a.reused  # the old artefact still matches its manifest; the lock died with the pid
    assert a.path == art


def test_sigkill_first_build_leaves_nothing_usable(store_root):
    art, manifest_path, _ = paths(store_root)
    art.unlink()
    manifest_path.unlink()
    proc = _spawn_build(store_root, pause=30)
    _wait_for_event(proc, "build_test_pause")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    store = EngineStore(store_root)
    assert not art.exists() and not manifest_path.exists()
    assert store.find(demo_spec(), "onnxruntime") is None
    leftovers = list(art.parent.glob(f".{ART}.tmp-*"))
    assert leftovers
    assert {Path(r["path"]) for r in store.prune()} == set(leftovers)
    a = store.prepare(demo_spec(), "onnxruntime", BuildOptions(), validate=False)
    assert not a.reused and a.reason == "missing" and art.exists()


def _limit_file_size() -> None:
    # Real EFBIG on any write past 1 MiB (the artefact is ~24 MiB); ignore SIGXFSZ so the
    # write fails with an error instead of killing the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_disk_full_is_a_clear_error_and_keeps_old(store_root):
    art, manifest_path, _ = paths(store_root)
    old_bytes, old_manifest = art.read_bytes(), manifest_path.read_text()
    code = ("from stgcnd.errors import UserError\ntry:\n"
            + "\n".join("    " + line for line in prepare_code(store_root, "test").splitlines())
            + "\nexcept UserError as e:\n    print('USERERROR', e)\n")
    r = run_python(code, preexec_fn=_limit_file_size)
    assert "USERERROR" in r.stdout, r.stdout + r.stderr
    assert "File too large" in r.stdout and "previous artefact" in r.stdout
    assert art.read_bytes() == old_bytes and manifest_path.read_text() == old_manifest
    assert EngineStore(store_root).prepare(demo_spec(), "onnxruntime").reused


def test_unwritable_store_is_a_clear_error(store_root, tmp_path):
    if os.geteuid() == 0:
        # root writes through chmod: use another real failure, a store below a regular file.
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("")
        with pytest.raises(UserError, match="Not a directory"):
            EngineStore(blocker / "engines").prepare(demo_spec(), "onnxruntime")
        return
    art, _manifest_path, _ = paths(store_root)
    old_bytes = art.read_bytes()
    os.chmod(art.parent, 0o555)
    try:
        with pytest.raises(UserError, match="Permission denied"):
            EngineStore(store_root).prepare(demo_spec(), "onnxruntime", rebuild="test")
    finally:
        os.chmod(art.parent, 0o755)
    assert art.read_bytes() == old_bytes


def test_an_artefact_built_by_this_store_is_not_announced_as_reused(tmp_path):
    # auto measures a runtime (building its artefact), then serves it: the second ask is a
    # reuse with the reason BUILT_HERE, which `stgcnd build` and the demo show as built.
    store_root = tmp_path / "engines"
    store = EngineStore(store_root)
    first = store.prepare(demo_spec(), "onnxruntime", BuildOptions(), validate=False)
    with capture_logs() as logs:
        again = store.prepare(demo_spec(), "onnxruntime", BuildOptions())
    assert not first.reused and again.reused and again.reason == BUILT_HERE
    assert [e.get("built_here") for e in logs if e["event"] == "engine_reused"] == [True]
    assert describe(again).startswith("built onnxruntime fp32")
    later = EngineStore(store_root).prepare(demo_spec(), "onnxruntime", BuildOptions())
    assert later.reused and later.reason is None and describe(later).startswith("reused")


def test_another_form_of_the_graph_never_replaces_the_served_models_export(store_root):
    """The bench's baseline rows ask for the einsum form of the same model, against the same
    store. On an H100 that re-exported the served model's ONNX under it, and the daemon's next
    start found its tuned artefact stale and tuned it all over again. Each form is a model
    directory of its own; the default's id is what it always was."""
    store = EngineStore(store_root)
    served, einsum = demo_spec(), demo_spec(graph_op="einsum")
    _, _, onnx = paths(store_root)
    before = sha(onnx)
    assert store.model_dir(einsum) != store.model_dir(served)
    store.prepare(einsum, "onnxruntime", BuildOptions())
    assert sha(onnx) == before
    assert store.find(served, "onnxruntime") is not None  # still current: nothing to rebuild
    assert store.find(einsum, "onnxruntime") is not None
