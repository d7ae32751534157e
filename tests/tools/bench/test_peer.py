"""The bench's peer rows (bench/peer.py): a user's own torch.compile, each in a fresh process."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stgcnd.errors import BackendUnavailable
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from stgcnd_tools.bench.peer import PeerJob, check_precision, describe, run_peer
from stgcnd_tools.bench.report import format_peer_ratios, format_table

torch = pytest.importorskip("torch")

from stgcnd.model import load_model, reference_logits

SPEC = ModelSpec(frames=16, persons=1)  # the demo model, a short window


def test_each_row_says_what_it_is():
    assert describe("max-autotune", "cuda") == (
        "torch.compile(mode='max-autotune', dynamic=False), one compile per batch size, "
        "inductor's CUDA graphs, fresh process")
    assert "no CUDA graphs" in describe("default", "cuda")
    assert "no CUDA graphs" in describe("reduce-overhead", "cpu")  # inductor graphs: CUDA only
    check_precision("fp16", "cuda")
    for precision, device in (("fp16", "cpu"), ("bf16", "cuda"), ("int8", "cuda")):
        with pytest.raises(BackendUnavailable):
            check_precision(precision, device)


def test_a_peer_runs_in_its_own_process_and_gives_the_modules_logits(tmp_path):
    """The plumbing with the fused module uncompiled (mode None): the windows go to a fresh
    process, its times and logits come back, equal to the reference's up to rounding."""
    x = synthetic_windows(3, SPEC.frames, 1, SPEC.num_node, seed=4)
    result = run_peer(SPEC, PeerJob({}, "fp32", "cpu", None, iterations=4, warmup=1), x,
                      tmp_path / "cache")
    assert len(result.times_ms) == 4 and min(result.times_ms) > 0
    assert result.first_call_s > 0
    ref = reference_logits(load_model(SPEC), x)
    assert result.logits.shape == ref.shape
    assert np.max(np.abs(result.logits - ref)) <= 1e-4
    assert (tmp_path / "cache").is_dir()


def test_a_failed_child_is_a_skipped_row_with_its_last_lines(tmp_path):
    spec = ModelSpec(checkpoint=str(tmp_path / "missing.pt"), frames=16)
    x = synthetic_windows(1, 16, 1, spec.num_node, seed=4)
    with pytest.raises(BackendUnavailable, match=r"the child exited 1: .*missing\.pt"):
        run_peer(spec, PeerJob({}, "fp32", "cpu", None, iterations=1, warmup=0), x)


def _row(backend, persons, batch, median):
    return {"backend": backend, "precision": "fp16", "persons": persons, "batch": batch,
            "sessions": 1, "median_ms": median, "min_ms": median, "p99_ms": median,
            "windows_per_s": batch * 1e3 / median}


def test_the_peer_summary_puts_ours_against_each_user_row():
    rows = [_row("torch-eager", 1, 64, 40.0), _row("torch-compile-cudagraph", 1, 64, 8.0),
            _row("torch.compile-default", 1, 64, 10.0),
            _row("torch.compile-max-autotune", 1, 64, 4.0),
            _row("torch-compile-cudagraph", 5, 1, 2.0), _row("torch.compile", 5, 1, 3.0)]
    lines = format_peer_ratios(rows).splitlines()
    assert len(lines) == 2 + 3  # head, rule, one line a peer row
    default, autotune, m5 = (line.split() for line in lines[2:])
    assert default[-4:] == ["torch.compile-default", "10.00", "6400.0", "1.25x"]
    assert autotune[3:5] == ["8.00", "8000.0"] and autotune[-1] == "0.50x"
    assert m5[:2] == ["5", "1"] and m5[-1] == "1.50x"
    rows[2]["what"] = describe("default", "cuda")
    assert f"torch.compile-default: {rows[2]['what']}" in format_table(
        [{**r, "device": "cuda", "p99_ms": 1.0} for r in rows])


@pytest.mark.slow
def test_the_bench_compiles_a_peer_row_on_the_cpu(tmp_path, stgcnd_main):
    """torch.compile(mode='default') of the fused module on the CPU (a minute or two of
    inductor's C++ compile): the row, its one-line description, its parity."""
    out = tmp_path / "bench.json"
    proc = stgcnd_main("bench", "--frames", "16", "--backends", "torch.compile-default",
                       "--iterations", "2", "--warmup", "0", "--store", str(tmp_path / "s"),
                       "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    base, peer = json.loads(out.read_text())
    assert (base["backend"], peer["backend"]) == ("torch-eager", "torch.compile-default")
    assert peer["note"].startswith(describe("default", "cpu") + "; first call ")
    assert peer["max_abs_diff"] <= 1e-4 and peer["iterations"] == 2
    assert describe("default", "cpu") in proc.stdout
