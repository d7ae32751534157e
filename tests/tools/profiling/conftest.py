"""Fixtures for the trtexec toolkit tests.

Real trtexec artefacts live outside the repository, in `<repo root>/../shared/trtexec/` (see its
README for sources); tests that need them skip when that folder is missing. Hand-made
fixtures are in ./data (see data/README.md); the stand-in trtexec is ./bin/trtexec.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SHARED = (REPO / ".." / "shared" / "trtexec").resolve()
DATA = Path(__file__).resolve().parent / "data"
FAKE_TRTEXEC = Path(__file__).resolve().parent / "bin" / "trtexec"

# Which real file is which kind, from the shared README's table (not from our detector).
SHARED_KINDS = {
    "trex_tf-resnet50_rtx3090_fp32.exportTimes.json": "times",
    "trex_tf-resnet50_rtx3090_fp32.exportProfile.json": "profile",
    "trex_tf-resnet50_rtx3090_fp32.exportLayerInfo.json": "layer_info",
    "trex_tf-resnet50_rtx3090_fp32.profile.metadata.json": "trex_profile_metadata",
    "trex_tf-resnet50_rtx3090_fp32.build.metadata.json": "trex_build_metadata",
    "trex_mobilenetv2-qat_titanrtx.exportLayerInfo.json": "layer_info",
    "trex_mobilenetv2-qat_titanrtx.exportProfile.json": "profile",
    "fuzzylabs_resnet18_fp16_rtx3060_trt10.exportLayerInfo.json": "layer_info",
    "fuzzylabs_resnet18_fp16_rtx3060_trt10.exportProfile.json": "profile",
    "fuzzylabs_resnet18_fp16_rtx3060_trt10.build.metadata.json": "trex_build_metadata",
    "fuzzylabs_resnet18_fp16_rtx3060_trt10.profile.metadata.json": "trex_profile_metadata",
    "farabimahmud_detr_int8.exportLayerInfo.layer_names_only.json": "layer_info",
    "farabimahmud_detr_int8.exportProfile.json": "profile",
    "nvidia_qat-ptq-notebook_mobilenetv2_fp32_trt8.2.5.trtexec.log": "log",
    "nvidia_qat-ptq-notebook_mobilenetv2_qat-int8_trt8.2.5.trtexec.log": "log",
}
HANDMADE_KINDS = {
    "handmade_trt10_times.json": "times",
    "handmade_trt7_times.json": "times",
    "handmade_profile_unescaped_quote.json": "profile",
    "handmade_profile_trt82_no_median.json": "profile",
    "handmade_trt11_layerinfo.json": "layer_info",
    "handmade_trt10.3_trtexec.log": "log",
}


@pytest.fixture(scope="session")
def shared() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"real trtexec artefacts not found at {SHARED} (expected next to the "
                    "repository as ../shared/trtexec)")
    return SHARED


def shared_files(kind: str) -> list[str]:
    return [name for name, k in SHARED_KINDS.items() if k == kind]


def make_run_dir(target: Path, files: list[Path]) -> Path:
    """A run folder holding links to existing artefacts (nothing is copied into the repo)."""
    target.mkdir(parents=True, exist_ok=True)
    for file in files:
        (target / file.name).symlink_to(file)
    return target


@pytest.fixture
def fake_trtexec_env(tmp_path: Path) -> dict[str, str]:
    """Environment for CLI subprocesses: stand-in trtexec on PATH, argv recorded."""
    env = dict(os.environ)
    env["PATH"] = f"{FAKE_TRTEXEC.parent}{os.pathsep}{env.get('PATH', '')}"
    env["FAKE_TRTEXEC_ARGV"] = str(tmp_path / "argv.json")
    env["PYTHONUNBUFFERED"] = "1"
    return env


PYTHON = sys.executable
