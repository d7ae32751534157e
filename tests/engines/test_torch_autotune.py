"""max-autotune's trial processes: a bucket whose trial dies, hangs or cannot run falls back to
the default kernels, and only that bucket (engines/builders/torch_autotune.py)."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from stgcnd.engines.builders.torch_autotune import (
    FALLBACK,
    TUNED,
    _time_in_turns,
    _verdict,
    try_buckets,
    tuned_buckets,
)
from stgcnd.engines.options import BuildOptions
from stgcnd.model.reference import torch_installed
from stgcnd.model.spec import ModelSpec

# A stand-in for the trial process (the real one needs CUDA): it speaks the same lines, and
# on the bucket named in the job's spec it dies by a signal, or hangs, the first time only.
STAND_IN = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path
    job = json.loads(Path(sys.argv[-1]).read_text())
    bad, how, mark = job["spec"]["bad"], job["spec"]["how"], Path(job["spec"]["mark"])
    for b in job["buckets"]:
        print(json.dumps({"trial": 1, "trying": b}), flush=True)
        if b == bad and not mark.exists():
            mark.touch()
            if how == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(600)
        print("a line that is not ours", flush=True)
        print(json.dumps({"event": "a log line"}), flush=True)
        verdict = {"mode": "max-autotune", "seconds": 0}
        print(json.dumps({"trial": 1, "bucket": b, "verdict": verdict}), flush=True)
""")


@pytest.fixture
def stand_in(tmp_path):
    script = tmp_path / "trial.py"
    script.write_text(STAND_IN)
    return (sys.executable, str(script))


def test_a_fault_takes_only_its_bucket(tmp_path, stand_in):
    spec = {"bad": 16, "how": "segv", "mark": str(tmp_path / "once")}
    trials = try_buckets(spec, "fp16", (1, 4, 16, 64), tmp_path, python=stand_in)
    assert trials["16"]["mode"] == FALLBACK
    assert "exit status -11 while trying it" in trials["16"]["why"]
    assert {b for b in trials if trials[b]["mode"] == TUNED} == {"1", "4", "64"}
    assert tuned_buckets({"builder": {"autotune": trials}}) == {1, 4, 64}


def test_a_hung_bucket_is_ended_at_its_timeout(tmp_path, stand_in):
    spec = {"bad": 4, "how": "hang", "mark": str(tmp_path / "once")}
    # 1 s: the stand-in starts and answers in about 0.05 s (it imports nothing but json).
    trials = try_buckets(spec, "fp16", (1, 4, 8), tmp_path, python=stand_in, timeout_s=1)
    assert trials["4"] == {"mode": FALLBACK,
                           "why": "its trial ran past 1 s while trying it (a kernel fault "
                                  "ends the CUDA context)"}
    assert trials["1"]["mode"] == trials["8"]["mode"] == TUNED


@pytest.mark.skipif(not torch_installed(), reason="the trial process runs torch")
def test_without_cuda_every_bucket_falls_back_with_the_reason(tmp_path):
    # The real trial process: on this machine it cannot open a CUDA runtime, tries nothing,
    # and a second process is not started for the same end.
    trials = try_buckets(ModelSpec(persons=1).to_dict(), "fp16", (1, 2), tmp_path)
    assert set(trials) == {"1", "2"}
    for t in trials.values():
        assert t["mode"] == FALLBACK
        assert t["why"].startswith("the trial process ended with exit status 1 before trying")


def test_max_autotune_is_part_of_a_torch_key_on_cuda_only():
    tuned = BuildOptions(precision="fp16", max_batch=8, device="cuda", compile="max-autotune")
    default = BuildOptions(precision="fp16", max_batch=8, device="cuda", compile="auto")
    assert tuned.key_dict("torch")["buckets"] == [1, 2, 4, 8]
    assert "compile" not in default.key_dict("torch")
    assert "compile" not in tuned.key_dict("onnxruntime")
    cpu = BuildOptions(precision="fp32", max_batch=8, device="cpu", compile="max-autotune")
    assert "compile" not in cpu.key_dict("torch")


REFERENCE_OK = {"finite": True, "max_abs_diff": 1e-3}


def test_tuned_kernels_serve_only_where_they_measured_faster_than_the_default_ones():
    kept = _verdict(REFERENCE_OK, 2e-2, 80.0, False, tuned_ms=6.0, default_ms=7.7)
    assert (kept["mode"], kept["tuned_ms"], kept["default_ms"]) == (TUNED, 6.0, 7.7)
    slower = _verdict(REFERENCE_OK, 2e-2, 80.0, False, tuned_ms=7.8, default_ms=7.7)
    assert slower["mode"] == FALLBACK
    assert slower["why"] == ("its autotuned kernels took 7.800 ms against the default "
                             "kernels' 7.700 ms")
    wrong = _verdict({"finite": True, "max_abs_diff": 1.0}, 2e-2, 80.0, False, 6.0, 7.7)
    assert wrong["mode"] == FALLBACK and "reference" in wrong["why"]
    assert _verdict(REFERENCE_OK, 2e-2, 80.0, True, 6.0, 7.7)["mode"] == FALLBACK


def test_runners_timed_in_turns_keep_their_order():
    def slow() -> None:
        time.sleep(0.002)

    def quick() -> None:
        time.sleep(0.0002)

    slow_ms, quick_ms = _time_in_turns([slow, quick])
    assert quick_ms < slow_ms
    assert slow_ms >= 2.0
