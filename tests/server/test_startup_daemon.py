"""`stgcnd serve` start-up against a real engine store, as a real subprocess daemon:
a read-only store serves (#12.7), an unloadable artefact is rebuilt (#12.8), SIGTERM during a
first-start build stops promptly and leaves nothing partial (#12.9), a fatal start-up error
is a JSON event (#12.11)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.fsutil import file_sha256
from stgcnd.model.spec import ModelSpec
from stgcnd_client import Client
from stgcnd_tools.daemon import DaemonProcess
from tests.conftest import REPO
from tests.engines.readonly import read_only
from tests.engines.test_load_failure import break_but_keep_manifest
from tests.server.daemon_harness import FRAMES, Daemon, write_config

pytestmark = pytest.mark.slow

ORT_MODEL = (f'[[models]]\nname = "demo"\nframes = {FRAMES}\nbackend = "onnxruntime"\n'
             'device = "cpu"\ndemo = true\nmax_batch = 1\nlabels = ["normal", "shoplifting"]\n')
ART = "onnxruntime-fp32-cpu-b1"


class PrefixedDaemon(Daemon):
    """The harness's daemon, started through an argv prefix (e.g. a read-only mount)."""

    def __init__(self, tmp: Path, prefix: list[str], **kw) -> None:
        super().__init__(tmp, **kw)
        self.prefix = prefix

    def start(self, wait_ready: bool = True) -> Daemon:
        self.proc = DaemonProcess(self.config_path, self.log_path, prefix=self.prefix,
                                  env=self.env, cwd=REPO).start().proc
        if wait_ready:
            self.notify.wait_for("READY", timeout=180)
        return self


@pytest.fixture
def daemons():
    made: list[Daemon] = []
    yield made
    for d in made:
        d.close()


@pytest.fixture(scope="module")
def seed_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seed") / "engines"
    EngineStore(root).prepare(ModelSpec(frames=FRAMES), "onnxruntime", BuildOptions())
    return root


def _store(seed_store: Path, tmp: Path) -> tuple[Path, Path, Path]:
    root = tmp / "engines"
    shutil.copytree(seed_store, root)
    mdir = EngineStore(root).model_dir(ModelSpec(frames=FRAMES))
    return root, mdir / f"{ART}.onnx", mdir / f"{ART}.json"


def _config(tmp: Path, models: str = ORT_MODEL, **server: object) -> Path:
    return write_config(tmp / "stgcnd.toml", f"ipc://{tmp / 'd.sock'}", tmp / "engines",
                        models=models, **server)


def _events(d: Daemon, name: str) -> list[dict]:
    return [e for e in d.log_events() if e.get("event") == name]


def _all_lines_json(d: Daemon) -> None:
    for line in d.log_path.read_text().splitlines():
        if line.strip():
            json.loads(line)  # raises on any line that is not a JSON event


def _infer_ok(d: Daemon) -> None:
    with Client(d.endpoint, camera_id="cam", timeout=60) as c:
        r = c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
    assert r.label_name in ("normal", "shoplifting") and np.isfinite(r.probs).all()


# --- #12.7: read-only store ----------------------------------------------------------------

def test_read_only_store_with_current_artefacts_serves(seed_store, tmp_path, daemons):
    root, _art, _ = _store(seed_store, tmp_path)
    before = sorted(p.name for p in root.rglob("*"))
    with read_only(root) as prefix:
        d = PrefixedDaemon(tmp_path, prefix, config_path=_config(tmp_path))
        daemons.append(d)
        d.start()
        _infer_ok(d)
        assert d.stop() == 0
    assert _events(d, "engine_store_read_only") and _events(d, "engine_reused")
    assert not _events(d, "engine_rebuilt")
    assert sorted(p.name for p in root.rglob("*")) == before


def test_read_only_store_that_needs_a_build_is_one_json_error(seed_store, tmp_path, daemons):
    root, art, manifest = _store(seed_store, tmp_path)
    art.unlink()
    manifest.unlink()
    with read_only(root) as prefix:
        d = PrefixedDaemon(tmp_path, prefix, config_path=_config(tmp_path))
        daemons.append(d)
        d.start(wait_ready=False)
        assert d.proc.wait(timeout=180) == 2
    _all_lines_json(d)
    [failed] = _events(d, "startup_failed")
    assert failed["error_type"] == "StoreReadOnly" and "read-only" in failed["error"]
    assert "stgcnd build" in failed["error"] and "engines_dir" in failed["error"]
    assert failed["level"] == "error" and failed["hint"]


# --- #12.8: an artefact that fails to load ---------------------------------------------------

def test_daemon_rebuilds_an_artefact_that_fails_to_load(seed_store, tmp_path, daemons):
    _root, art, manifest = _store(seed_store, tmp_path)
    good = art.read_bytes()
    break_but_keep_manifest(art, manifest)
    d = Daemon(tmp_path, config_path=_config(tmp_path))
    daemons.append(d)
    d.start()
    _infer_ok(d)
    assert d.stop() == 0
    [rebuilt] = _events(d, "engine_rebuilt")
    assert rebuilt["reason"].startswith("failed to load: ")
    assert "Traceback" not in d.log_path.read_text()
    assert art.read_bytes() == good


# --- #12.9: SIGTERM during a first-start build ----------------------------------------------

# INT8 at T=150: export, then a Q/DQ calibration over 64 synthetic windows (tens of seconds
# on this CPU): a genuinely slow first-start build, no test hook needed.
SLOW_MODEL = ('[[models]]\nname = "slow"\nframes = 150\nbackend = "onnxruntime"\n'
              'device = "cpu"\ndemo = true\nprecision = "int8"\n'
              'allow_synthetic_calibration = true\n')


def _wait_event(d: Daemon, name: str, timeout: float = 180) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = _events(d, name)
        if found:
            return found[0]
        assert d.proc.poll() is None, d.log_path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"no {name}; log:\n{d.log_path.read_text()}")


@pytest.mark.parametrize("during", ["onnx_export_needed", "engine_build_started"])
def test_sigterm_during_first_build_stops_promptly_and_leaves_nothing(tmp_path, daemons,
                                                                      during):
    d = Daemon(tmp_path, config_path=_config(tmp_path, SLOW_MODEL))
    daemons.append(d)
    d.start(wait_ready=False)
    _wait_event(d, during)
    time.sleep(1.0)  # well inside the step
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    code = d.proc.wait(timeout=60)
    seconds = time.monotonic() - t0
    assert code == 0 and seconds < 10, (code, seconds, d.log_path.read_text())
    print(f"SIGTERM during {during}: exited in {seconds:.2f} s")
    _all_lines_json(d)
    [cancelled] = _events(d, "engine_build_cancelled")
    [done] = _events(d, "shutdown_complete")
    assert done["phase"] == "startup" and done["exit_code"] == 0
    assert not _events(d, "engine_rebuilt") and not _events(d, "ready")
    with pytest.raises(ProcessLookupError):
        os.kill(cancelled["pid"], 0)  # the build process is gone
    root = tmp_path / "engines"
    leftovers = [p for p in root.rglob("*") if ".tmp-" in p.name or p.name.endswith(".part")]
    assert leftovers == []
    assert not list(root.glob("*/onnxruntime-int8-*"))  # no artefact, no manifest
    for onnx in root.rglob("*.onnx"):  # an ONNX committed before the signal is whole
        sidecar = json.loads(Path(str(onnx) + ".json").read_text())
        assert file_sha256(onnx) == sidecar.get("onnx_sha256", sidecar.get("sha256"))
    for lock in root.rglob("*.lock"):  # every lock is free again
        with open(lock) as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert EngineStore(root).prune(dry_run=True) == []


# --- #12.11: fatal start-up errors are JSON events ------------------------------------------

def _not_a_socket(tmp: Path) -> Path:
    (tmp / "d.sock").write_text("a regular file where the socket should be")
    # noop: runs on the base install too (torch is not there, and would be refused first).
    return _config(tmp, models=ORT_MODEL.replace('backend = "onnxruntime"', 'backend = "noop"'))


@pytest.mark.parametrize("case, make_config, says", [
    ("bad config", lambda t: _config(t, ORT_MODEL.replace("onnxruntime", "nope")),
     "backend must be one of"),
    ("cannot listen", _not_a_socket, "not a socket"),
    ("build refused", lambda t: _config(t, ORT_MODEL.replace(
        'device = "cpu"', 'device = "cpu"\nprecision = "int8"')), "calibration"),
    ("model cannot load", lambda t: _config(t, ORT_MODEL.replace(
        'demo = true\n', f'checkpoint = "{t / "missing.pt"}"\n')), "missing.pt"),
])
def test_fatal_startup_error_is_one_json_event(tmp_path, daemons, case, make_config, says):
    d = Daemon(tmp_path, config_path=make_config(tmp_path))
    daemons.append(d)
    d.start(wait_ready=False)
    assert d.proc.wait(timeout=180) == 2, d.log_path.read_text()
    _all_lines_json(d)  # under systemd stdout and stderr both reach the journal
    [failed] = _events(d, "startup_failed")
    assert says in failed["error"] and failed["hint"] and failed["exit_code"] == 2
    assert "Traceback" not in d.log_path.read_text()


NOOP_MODEL = (f'[[models]]\nname = "demo"\nbackend = "noop"\ndemo = true\nframes = {FRAMES}\n')


@pytest.mark.parametrize("flag", [None, "info"])
def test_the_configs_log_level_applies_unless_the_flag_is_given(tmp_path, daemons, flag):
    """`[server] log_level` is the daemon's level; `--log-level` overrides it (#33: the key
    had no effect at all)."""
    d = Daemon(tmp_path, models=NOOP_MODEL, log_level="debug")
    if flag:
        d.start_args = ["--log-level", flag]
    daemons.append(d)
    d.start()
    with Client(d.endpoint, camera_id="cam") as c:
        c.infer(np.zeros((3, FRAMES, 33, 1), np.float32))
    assert d.stop() == 0
    per_request = [e for e in d.log_events() if e.get("event") == "request"]
    assert bool(per_request) == (flag is None), per_request[:1]
