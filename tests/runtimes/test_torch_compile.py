"""torch.compile in the torch runtime (runtimes/torch_compile.py): where it runs, what it
computes, where its caches go, and the fall-back when a compile fails.

The CUDA tests run on the GPU test machine (`pytest -m gpu tests/runtimes`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from structlog.testing import capture_logs

torch = pytest.importorskip("torch")

from stgcnd.model.reference import reference_logits
from stgcnd.model.synthetic import synthetic_windows
from stgcnd.runtimes import torch_compile
from stgcnd.runtimes.torch_runtime import TorchRuntime
from tests.conftest import REPO
from tests.runtimes.conftest import fp16_tol, opened, parity_tol


def gpu_with_triton(test):
    no = (not torch.cuda.is_available()
          or torch_compile.unavailable(torch.device("cuda")) is not None)
    return pytest.mark.gpu(pytest.mark.skipif(no, reason="needs a CUDA GPU with Triton")(test))


def test_the_cpu_serves_uncompiled_and_says_why_when_asked(small_model, windows):
    assert torch_compile.resolve("auto", torch.device("cpu"))[0] == "off"
    mode, why = torch_compile.resolve("max-autotune", torch.device("cpu"))
    assert mode == "off" and "CUDA" in why
    with capture_logs() as logs, \
            TorchRuntime(small_model, "fp32", "cpu", compile_mode="max-autotune") as runtime, \
            opened(runtime, (4,)) as runner:
        assert runtime.info.details["compile"] == "off"
        out = runner.run(list(windows))
    assert [e["asked"] for e in logs if e["event"] == "torch_compile_unavailable"] == \
        ["max-autotune"]
    assert np.max(np.abs(out - reference_logits(small_model, windows))) <= 1e-4


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="reduce-overhead"):
        torch_compile.resolve("fast", torch.device("cpu"))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("cuda_graph", [True, False])
@gpu_with_triton
def test_compiled_buckets_match_the_reference(small_model, precision, cuda_graph,
                                              compile_cache):
    spec = small_model.spec
    x = synthetic_windows(8, spec.frames, spec.persons, spec.num_node, seed=5)
    ref = reference_logits(small_model, x)
    tol = parity_tol(precision, ref)
    with TorchRuntime(small_model, precision, "cuda", cuda_graph=cuda_graph, max_batch=8,
                      compile_mode="reduce-overhead", compile_cache=compile_cache) as runtime, \
            opened(runtime, (1, 4, 8), lanes=2) as runner:
        assert runtime.info.details["compile"] == "reduce-overhead"
        full = runner.run(list(x))
        three = runner.run(list(x[:3]))       # padded into bucket 4
        one = runner.run([x[5]])
    assert np.max(np.abs(full - ref)) <= tol
    assert np.max(np.abs(three - ref[:3])) <= tol
    assert np.max(np.abs(one - ref[5:6])) <= tol


def _graphs_compiled() -> int:
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def _reset_dynamo() -> None:
    from torch import _dynamo  # a submodule `import torch` leaves out before torch 2.1
    _dynamo.reset()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None,
                    reason="inductor's CPU kernels need a C++ compiler (g++, or $CXX)")
def test_dynamic_batch_kernels_compile_a_few_graphs_for_many_batch_sizes(compile_cache,
                                                                           monkeypatch):
    """The mechanism the stand-in serving while buckets are tuned relies on (inductor's
    kernels run the same way on the CPU; the daemon compiles only on CUDA)."""
    if not torch_compile.marks_dynamic():
        pytest.skip(f"torch {torch.__version__} has no mark_dynamic: a compile per bucket")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(compile_cache))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, (9, 1), padding=(4, 0)), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                              torch.nn.Linear(8, 2)).eval()
    batches = (1, 2, 4, 8, 12, 16, 24)
    counts = {}
    for dynamic in (True, False):
        _reset_dynamo()
        run = torch_compile.compiled(net, "reduce-overhead", static=True, dynamic_batch=dynamic)
        before = _graphs_compiled()
        with torch.inference_mode():
            for b in batches:
                x = torch.randn(b, 3, 30, 5)
                assert torch.allclose(run(x), net(x), atol=1e-5)
        counts[dynamic] = _graphs_compiled() - before
    assert counts[False] == len(batches)  # static: a compile per batch size
    assert counts[True] <= 3, counts      # batch 1, and kernels dynamic in the batch


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@gpu_with_triton
def test_dynamic_batch_kernels_in_our_graphs_match_the_reference(small_model, precision,
                                                                 compile_cache):
    """What serves at once while the buckets are tuned: fewer compiles than buckets, each
    bucket's graph computing what the reference computes."""
    spec = small_model.spec
    x = synthetic_windows(16, spec.frames, spec.persons, spec.num_node, seed=7)
    ref = reference_logits(small_model, x)
    tol = parity_tol(precision, ref)
    buckets = (1, 2, 4, 8, 12, 16)
    _reset_dynamo()
    before = _graphs_compiled()
    with TorchRuntime(small_model, precision, "cuda", cuda_graph=True, max_batch=16,
                      compile_mode="reduce-overhead", compile_cache=compile_cache,
                      dynamic_kernels=True) as runtime, \
            opened(runtime, buckets, lanes=2) as runner:
        assert "dynamic-batch" in runtime.info.details["variant"]
        outs = {n: runner.run(list(x[:n])) for n in (16, 11, 5, 2, 1)}
    graphs = _graphs_compiled() - before
    for n, out in outs.items():
        assert np.max(np.abs(out - ref[:n])) <= tol, n
    streams = 2 if runtime.parallel_streams else 1
    assert graphs < streams * len(buckets), graphs


@pytest.fixture
def compile_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    return tmp_path


# One process each: inductor's caches and dynamo's state are process-wide.
_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    import numpy as np
    import torch
    from stgcnd.model.reference import load_for_inference as load_model, reference_logits
    from stgcnd.model.spec import ModelSpec
    from stgcnd.model.synthetic import synthetic_windows
    from stgcnd.runtimes.torch_runtime import TorchRuntime

    root = Path(sys.argv[1])
    model = load_model(ModelSpec(frames=24, persons=1))  # the demo model
    x = synthetic_windows(2, 24, 1, 33, seed=3)
    with TorchRuntime(model, "fp16", "cuda", cuda_graph=True, max_batch=2,
                      compile_mode="reduce-overhead", compile_cache=root / "store") as rt:
        runner = rt.open_runner((1, 2), 0)
        out = runner.run(list(x))
        runner.close()
        print("compile", rt.info.details["compile"])
    ref = reference_logits(model, x)
    print("diff", float(np.max(np.abs(out - ref))), "scale", float(np.max(np.abs(ref))))
""")


def _within_fp16_bound(out: str) -> bool:
    diff, scale = (float(out.split(f"{k} ")[1].split()[0]) for k in ("diff", "scale"))
    return diff <= fp16_tol(np.array([scale]))


def _run_script(root, env_extra):
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO / "daemon"), str(REPO),
                                           env.get("PYTHONPATH", "")]), **env_extra)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(root)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
@gpu_with_triton
def test_the_compile_caches_live_in_the_store(tmp_path):
    out = _run_script(tmp_path, {})
    assert "compile reduce-overhead" in out and "torch_compiled" in out
    cache = tmp_path / "store" / "torch-compile"
    (key,) = cache.iterdir()
    assert key.name.startswith(f"torch{torch.__version__}")
    assert sum(1 for p in key.rglob("*") if p.is_file()) > 0, "nothing cached"
    assert _within_fp16_bound(out)


@pytest.mark.slow
@gpu_with_triton
def test_a_failed_compile_serves_uncompiled(tmp_path):
    """An unwritable cache (a file where inductor wants its directory) fails the compile:
    the runtime says so once and serves the uncompiled module, graphs and all."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    out = _run_script(tmp_path, {"TORCHINDUCTOR_CACHE_DIR": str(blocker / "cache")})
    assert "torch_compile_failed" in out
    assert "compile off (failed)" in out
    assert _within_fp16_bound(out)
