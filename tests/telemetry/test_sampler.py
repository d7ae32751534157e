"""SystemSampler with a real child process standing in for tegrastats."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stgcnd.telemetry.sampler import SAMPLE_FIELDS, SystemSampler

from .conftest import DATA, starts_of


def wait_for(predicate, timeout: float = 20.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def test_samples_from_a_tegrastats_child(make_tegrastats):
    script = make_tegrastats(DATA / "agx_orin_jp6_r36_4_4.txt")
    samples: list[dict] = []
    sampler = SystemSampler(0.1, samples.append, tegrastats_path=str(script))
    sampler.start()
    try:
        assert wait_for(lambda: sum(s["power_total_mw"] is not None for s in samples) >= 3)
    finally:
        sampler.stop(5.0)
    assert sampler.tegrastats.pid is None  # the child is gone
    with_gpu = [s for s in samples if s["power_total_mw"] is not None]
    for s in samples:
        assert tuple(s) == SAMPLE_FIELDS
        assert s["source"] == "tegrastats"
        assert s["rss_mb"] > 0 and s["ram_total_mb"] > 0 and s["cpu_pct"] is not None
    # Sums of the three rails on the recorded lines (4707 / 4607 / 4707 mW on VIN_SYS_5V0).
    assert {s["power_total_mw"] for s in with_gpu} <= {2412 + 1607 + 4707, 2412 + 1607 + 4607}
    s = with_gpu[-1]
    assert (s["gpu_freq_mhz"], s["emc_freq_mhz"], s["gpu_load_pct"]) == (0, 2133, 0)
    assert s["temps_c"]["tj"] in (52.562, 52.343, 52.156)
    assert s["temp_max_c"] == s["temps_c"]["tj"]
    assert s["cpu_freq_mhz"] in (2201, 2050)  # the fastest core of each line
    assert s["tegrastats_age_s"] is not None and s["tegrastats_restarts"] == 0


def test_a_dying_tegrastats_is_restarted(make_tegrastats):
    script = make_tegrastats(DATA / "thor_jp7_r39_2.txt", exit_after=2)
    sampler = SystemSampler(0.05, lambda s: None, tegrastats_path=str(script),
                            backoff_start_s=0.05)
    sampler.start()
    try:
        assert wait_for(lambda: starts_of(script) >= 3)
        assert wait_for(lambda: sampler.sample_once()["tegrastats_restarts"] >= 2)
        sample = sampler.sample_once()
        assert sample["gpu_freq_mhz"] == 314  # lines still arrive between restarts
    finally:
        sampler.stop(5.0)
    assert not sampler._thread


def test_sample_once_never_waits_for_a_silent_tegrastats(tmp_path):
    silent = tmp_path / "tegrastats"
    silent.write_text("#!/bin/sh\nexec sleep 60\n")
    silent.chmod(0o755)
    sampler = SystemSampler(0.05, lambda s: None, tegrastats_path=str(silent))
    sampler.start()
    try:
        sample = sampler.sample_once()
    finally:
        sampler.stop(5.0)
    assert sample["source"] == "tegrastats"
    assert sample["gpu_load_pct"] is None and sample["tegrastats_age_s"] is None
    assert sample["ram_used_mb"] > 0


def test_missing_tegrastats_binary_is_retried_not_fatal(tmp_path):
    sampler = SystemSampler(0.05, lambda s: None, tegrastats_path=str(tmp_path / "nope"),
                            backoff_start_s=0.02)
    sampler.start()
    try:
        assert wait_for(lambda: sampler.tegrastats.restarts >= 2)
        assert sampler.sample_once()["rss_mb"] > 0
    finally:
        sampler.stop(5.0)


def test_an_emit_that_raises_does_not_stop_sampling(make_tegrastats):
    script = make_tegrastats(DATA / "nano_jp461_root.txt")
    calls: list[dict] = []

    def emit(sample: dict) -> None:
        calls.append(sample)
        if len(calls) == 1:
            raise RuntimeError("log sink hiccup")

    sampler = SystemSampler(0.05, emit, tegrastats_path=str(script))
    sampler.start()
    try:
        assert wait_for(lambda: len(calls) >= 4)
    finally:
        sampler.stop(5.0)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_jetson_sysfs_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no tegrastats here
    root = tmp_path / "root"
    gpu = root / "sys/class/devfreq/17000000.ga10b"
    _write(gpu / "cur_freq", "306000000\n")
    _write(gpu / "device/load", "125\n")  # per mille
    _write(root / "sys/class/thermal/thermal_zone0/type", "gpu-thermal\n")
    _write(root / "sys/class/thermal/thermal_zone0/temp", "-256000\n")
    _write(root / "sys/class/thermal/thermal_zone1/type", "cpu-thermal\n")
    _write(root / "sys/class/thermal/thermal_zone1/temp", "45500\n")
    sampler = SystemSampler(1.0, lambda s: None, use_nvml=False, sysfs_root=str(root))
    sample = sampler.sample_once()
    assert sample["source"] == "sysfs"
    assert (sample["gpu_freq_mhz"], sample["gpu_load_pct"]) == (306, 12.5)
    assert sample["temps_c"] == {"gpu": None, "cpu": 45.5}
    assert sample["gpu_temp_c"] is None and sample["temp_max_c"] == 45.5


def test_no_gpu_source_still_gives_every_field(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    sampler = SystemSampler(1.0, lambda s: None, use_nvml=False, sysfs_root=str(tmp_path))
    sample = sampler.sample_once()
    assert tuple(sample) == SAMPLE_FIELDS
    assert sample["source"] == "none" and sample["gpu_load_pct"] is None
    assert sample["rss_mb"] > 0


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        SystemSampler(0, lambda s: None)
