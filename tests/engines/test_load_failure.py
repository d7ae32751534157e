"""An artefact that matches its manifest but does not load is rebuilt once, with the reason
(issue #12.8, #11.2); a same-size change to the exported ONNX is caught by its sha256
(issue #12.10). Real files, real ONNX Runtime."""

from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import pytest
from structlog.testing import capture_logs

from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.errors import UserError
from stgcnd.fsutil import file_sha256
from stgcnd.provision import open_runtime
from tests.engines.conftest import demo_spec
from tests.engines.test_store import paths


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def break_but_keep_manifest(art, manifest_path) -> None:
    """Overwrite the artefact's first bytes (same size) and make the manifest match it, as
    for a file the runtime cannot load although nothing in the store looks wrong."""
    with open(art, "r+b") as f:
        f.write(b"\xff" * 64)
    m = json.loads(manifest_path.read_text())
    m["sha256"], m["size_bytes"] = sha(art), art.stat().st_size
    manifest_path.write_text(json.dumps(m))


def test_artefact_that_fails_to_load_is_rebuilt_once(store_root):
    art, manifest_path, _ = paths(store_root)
    good = sha(art)
    break_but_keep_manifest(art, manifest_path)
    store = EngineStore(store_root)
    assert store.find(demo_spec(), "onnxruntime") is not None  # the store sees nothing wrong
    with capture_logs() as logs:
        runtime = open_runtime(demo_spec(), "onnxruntime", BuildOptions(), store)
    try:
        runner = runtime.open_runner((1,), 0)
        try:
            logits = runner.run([np.zeros(runtime.info.input_shape, np.float32)])
        finally:
            runner.close()
        assert logits.shape == (1, runtime.info.num_class) and np.isfinite(logits).all()
    finally:
        runtime.close()
    rebuilt = [e for e in logs if e["event"] == "engine_rebuilt"]
    assert len(rebuilt) == 1
    reason = rebuilt[0]["reason"]
    assert reason.startswith("failed to load: ") and "\n" not in reason
    assert "Protobuf" in reason or "INVALID" in reason  # ONNX Runtime's own words
    assert [e["event"] for e in logs].count("engine_load_failed") == 1
    assert sha(art) == good  # the rebuilt artefact, not the broken one


class StoreThatBreaksWhatItBuilds:
    """The real store, except that every artefact it rebuilds comes out unloadable (as when
    the runtime cannot load what it builds), to reach provisioning's second failure."""

    def __init__(self, root) -> None:
        self.store = EngineStore(root)
        self.root = root
        self.rebuilds = 0

    def find(self, *args, **kw):
        return self.store.find(*args, **kw)

    def prepare(self, model, backend, options=None, *, rebuild=None, validate=True):
        a = self.store.prepare(model, backend, options, rebuild=rebuild, validate=validate)
        if rebuild is not None:
            self.rebuilds += 1
            break_but_keep_manifest(a.path, a.manifest_path)
        return a


def test_rebuilt_artefact_that_fails_too_is_one_clear_error(store_root):
    art, manifest_path, _ = paths(store_root)
    break_but_keep_manifest(art, manifest_path)
    store = StoreThatBreaksWhatItBuilds(store_root)
    with pytest.raises(UserError) as err:
        open_runtime(demo_spec(), "onnxruntime", BuildOptions(), store)
    msg = str(err.value)
    assert store.rebuilds == 1  # once, not in a loop
    assert "fails to load just after it was built" in msg and str(art) in msg
    assert "\n" not in msg and "stgcnd doctor" in msg


def test_flipped_byte_in_the_onnx_is_detected_and_reexported(store_root):
    _, _, onnx = paths(store_root)
    good = sha(onnx)
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the content hash can tell
    onnx.write_bytes(bytes(data))
    store = EngineStore(store_root)
    assert store.find(demo_spec(), "onnxruntime") is None
    with capture_logs() as logs:
        a = store.prepare(demo_spec(), "onnxruntime", BuildOptions(), validate=False)
    needed = [e for e in logs if e["event"] == "onnx_export_needed"]
    assert [e["reason"] for e in needed] == ["corrupt: sha256 differs from its sidecar"]
    assert sha(onnx) == good  # the export is deterministic: the same graph again
    assert a.manifest["key_parts"]["onnx_sha256"] == good


def test_hashing_cost_at_start(store_root):
    """What verifying the ONNX and the artefact costs at each start (not per request)."""
    art, _, onnx = paths(store_root)
    t0 = time.perf_counter()
    for f in (onnx, art):
        file_sha256(f)
    seconds = time.perf_counter() - t0
    mb = (onnx.stat().st_size + art.stat().st_size) / 1e6
    print(f"sha256 of {mb:.1f} MB (ONNX + artefact): {seconds * 1e3:.0f} ms")
    assert seconds < 2.0
