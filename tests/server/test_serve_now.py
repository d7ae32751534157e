"""What serves at once while the configured artefact is built (server/serve_now.py), on a real
store: torch with compile "auto" on CUDA serves inductor's default kernels while every bucket
is autotuned, and serves the tuned ones once their trials are stored."""

from __future__ import annotations

import dataclasses

import pytest

from stgcnd.engines.options import BuildOptions
from stgcnd.engines.store import EngineStore
from stgcnd.model.reference import torch_installed
from stgcnd.model.spec import ModelSpec
from stgcnd.provision.load import Choice
from stgcnd.server.serve_now import (
    current_runners_serve_on,
    default_kernels_while_tuning,
    serve_now_instead,
)

CUDA_AUTO = BuildOptions(precision="fp16", max_batch=4, device="cuda", compile="auto",
                         cuda_graph=True)


def test_compile_auto_serves_the_default_kernels_while_the_buckets_are_tuned(tmp_path):
    store = EngineStore(tmp_path)
    choice = Choice("torch", CUDA_AUTO, "configured")
    now = default_kernels_while_tuning(choice, ModelSpec(persons=1), store, None)
    assert now is not None
    assert (now.backend, now.options.compile, now.options.device) == \
        ("torch", "reduce-overhead", "cuda")
    assert now.options.dynamic_kernels  # a few compiles to READY, not one per bucket
    assert "autotuned" in now.why
    assert choice.options.compile == "max-autotune"  # what the background builds
    assert not choice.options.dynamic_kernels       # the tuned runtime's buckets are static
    # The same artefact (a runtime-only option): the stand-in's validation record is found.
    assert now.options.key_dict("torch") == dataclasses.replace(
        CUDA_AUTO, compile="reduce-overhead").key_dict("torch")


def test_without_triton_auto_serves_the_default_kernels_and_tunes_nothing(tmp_path):
    choice = Choice("torch", CUDA_AUTO, "configured")
    why = "Triton is not installed (inductor's GPU kernels need it; ...)"
    assert default_kernels_while_tuning(choice, ModelSpec(persons=1), EngineStore(tmp_path),
                                        why) is None
    assert choice.options.compile == "auto"


@pytest.mark.parametrize("options", [
    BuildOptions(precision="fp16", max_batch=4, device="cuda", compile="reduce-overhead",
                 cuda_graph=True),
    BuildOptions(precision="fp16", max_batch=4, device="cuda", compile="auto",
                 cuda_graph=False),   # the trials run inside our CUDA graphs
    BuildOptions(precision="fp32", max_batch=4, device="cpu", compile="auto"),
], ids=["compile-named", "no-cuda-graph", "cpu"])
def test_only_compile_auto_with_cuda_graphs_on_cuda_is_tuned_in_the_background(tmp_path,
                                                                                options):
    choice = Choice("torch", options, "configured")
    assert serve_now_instead(choice, ModelSpec(persons=1), EngineStore(tmp_path)) is None
    assert choice.options == options


@pytest.mark.skipif(not torch_installed(), reason="the store's torch build loads the model")
def test_once_the_trials_are_stored_a_start_serves_them(tmp_path):
    """The background build's artefact (here made on this CPU: its trial process finds no CUDA
    and every bucket keeps the default kernels, which is its real verdict here) is what the
    next start finds: nothing serves instead, the choice serves the stored trials."""
    store, spec = EngineStore(tmp_path), ModelSpec(persons=1)
    first = Choice("torch", CUDA_AUTO, "configured")
    assert default_kernels_while_tuning(first, spec, store, None) is not None
    artifact = store.prepare(spec, "torch", first.options)
    assert set(artifact.manifest["builder"]["autotune"]) == {"1", "2", "4"}
    again = Choice("torch", CUDA_AUTO, "configured")
    assert default_kernels_while_tuning(again, spec, store, None) is None
    assert again.options.compile == "max-autotune"


def test_a_reload_keeps_the_current_runners_only_for_a_lesser_stand_in_or_an_engine(tmp_path):
    """What a reload does while the new configuration's artefact builds: the model's current
    runners serve on instead of a lesser stand-in (the fp32 session for int8), or while a
    TensorRT engine not in the store builds; torch's default kernels serve the new
    configuration at once (seconds a bucket) while it is tuned, and an export is made by the
    reload."""
    store, spec = EngineStore(tmp_path), ModelSpec(persons=1)
    int8 = Choice("onnxruntime", BuildOptions(precision="int8", device="cpu"), "named")
    fp32 = Choice("onnxruntime", BuildOptions(precision="fp32", device="cpu"), "stand-in")
    assert current_runners_serve_on(int8, fp32, spec, store)
    tuned = Choice("torch", dataclasses.replace(CUDA_AUTO, compile="max-autotune"), "named")
    default = Choice("torch", dataclasses.replace(CUDA_AUTO, compile="reduce-overhead"), "now")
    assert not current_runners_serve_on(tuned, default, spec, store)
    engine = Choice("tensorrt", BuildOptions(precision="fp32", device="cuda"), "named")
    assert current_runners_serve_on(engine, None, spec, store)  # not in the store
    assert not current_runners_serve_on(fp32, None, spec, store)  # an export: the reload's
