"""`stgcnd build --config` prepares exactly what `stgcnd serve` loads (issue #31, item 6):
one plan (server/serving_plan.py) for both, on every configuration `serve` accepts, here or
for a board described by --platform/--device."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from stgcnd.cli import build_parser
from stgcnd.commands import build
from stgcnd.engines.store import EngineStore
from stgcnd.errors import UserError
from stgcnd.provision import first_that_serves
from stgcnd.server.config import load_config
from stgcnd.server.serving_plan import Target, serving_plan

# T does not matter to the plan or the store (as in tests/engines): short windows keep each
# build's export and ONNX Runtime artefact cheap.
FRAMES = 8

# Configurations `serve` accepts, each a [[models]] table (the demo model: no torch needed).
CONFIGS = {
    "auto-max-batch": "",
    "explicit-buckets": "max_batch = 6\nbuckets = [1, 3, 6]\n",
    "one-person": "persons = 1\nmax_batch = 1\n",
    "five-persons": "persons = 5\n",
    "instances": "instances = 2\nmax_batch = 4\n",
}


def write(tmp: Path, extra: str, backend: str = "onnxruntime") -> Path:
    path = tmp / "stgcnd.toml"
    path.write_text(f'[server]\nengines_dir = "{tmp / "engines"}"\n\n'
                    f'[[models]]\nname = "cam"\ndemo = true\nframes = {FRAMES}\n'
                    f'backend = "{backend}"\n{extra}')
    return path


def args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["build", *argv])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_build_config_prepares_what_serve_loads(tmp_path, name, capsys):
    config = write(tmp_path, CONFIGS[name])
    assert build.run(args("--config", str(config), "--no-validate")) == 0
    capsys.readouterr()
    (mc,) = load_config(config).models
    spec, options = serving_plan(mc)
    found = EngineStore(tmp_path / "engines").find(spec, "onnxruntime", options)
    assert found is not None, f"serve would not find what build --config made for {name}"
    assert options.max_batch >= 1 and f"-{options.batch_tag}." in Path(found.path).name


def test_platform_jetson_takes_the_jetsons_automatic_batch_and_exports_for_it(tmp_path,
                                                                             capsys):
    config = write(tmp_path, "", backend="tensorrt")
    ns = args("--config", str(config), "--platform", "jetson")
    jobs, store, target = build.jobs_from_config(config, ns)
    ((spec, backend, options),) = jobs
    assert (target.jetson, target.has_gpu(), target.here) == (True, True, False)
    assert (backend, options.max_batch, options.dynamic_batch, options.device,
            options.workspace_mb) == ("tensorrt", 8, True, "cuda", 384)
    # No TensorRT here: the board builds its engine; what it needs is the dynamic export.
    assert build.run(ns) == 0
    out = capsys.readouterr().out
    assert "exported" in out and "b1-8" in out
    onnx = store.onnx_path(store.model_dir(spec), dynamic_batch=True)
    assert json.loads(onnx.with_name(onnx.name + ".json").read_text())["dynamic_batch"]


def test_device_describes_the_targets_gpu(tmp_path):
    (mc,) = load_config(write(tmp_path, "", backend="auto")).models
    assert serving_plan(mc, Target.described("other", "cuda"))[1].max_batch == 64
    assert serving_plan(mc, Target.described("other", None))[1].max_batch == 16
    assert serving_plan(mc, Target.described("jetson", "cpu"))[1].max_batch == 16
    assert serving_plan(mc, Target.described("jetson", None))[1].max_batch == 8


def test_flags_that_would_build_something_else_are_refused_with_config(tmp_path):
    config = write(tmp_path, "")
    with pytest.raises(UserError, match="--precision, --max-batch"):
        build.jobs_from_config(config, args("--config", str(config), "--max-batch", "4",
                                            "--precision", "fp16"))
    with pytest.raises(UserError, match="--config"):
        build.run(args("--platform", "jetson"))


@pytest.mark.slow
def test_build_config_with_auto_prepares_what_the_auto_chain_serves(tmp_path, capsys):
    """backend auto and automatic max_batch (the defaults): build --config walks the chain as
    serve does, and serve's walk then finds its choice built (read from the auto cache)."""
    pytest.importorskip("torch")
    config = write(tmp_path, "", backend="auto")
    assert build.run(args("--config", str(config), "--no-validate")) == 0
    assert "built" in capsys.readouterr().out
    (mc,) = load_config(config).models
    spec, options = serving_plan(mc)
    store = EngineStore(tmp_path / "engines")
    _, choice = first_that_serves(spec, "auto", options, store, lambda choice: None)
    assert choice.options.max_batch == options.max_batch >= 1
    assert store.find(spec, choice.backend, choice.options) is not None
