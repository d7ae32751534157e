"""Options, keys, device identity parsing, windows loading, logit comparison."""

from __future__ import annotations

import numpy as np
import pytest

from stgcnd.board import l4t_release
from stgcnd.engines.calibration import load_windows
from stgcnd.engines.device import (
    device_slug,
    jetson_identity,
    parse_nvidia_smi,
)
from stgcnd.engines.keys import describe_key_change
from stgcnd.engines.options import BuildOptions
from stgcnd.engines.validate import compare_logits
from stgcnd.errors import UserError

# The first line of /etc/nv_tegra_release on a JetPack 6.0 (L4T 36.3) Orin.
TEGRA_36_3 = ("# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, "
              "DATE: Mon May  6 17:34:21 UTC 2024\n")


def test_build_options_defaults_and_validation():
    assert BuildOptions().dynamic_batch is False
    assert BuildOptions(max_batch=8).dynamic_batch is True
    assert BuildOptions(max_batch=8).batch_tag == "b1-8"
    for bad in ({"precision": "fp8"}, {"opt_level": 6}, {"max_batch": 0},
                {"max_batch": 4, "dynamic_batch": False}, {"device": "tpu"}):
        with pytest.raises(UserError):
            BuildOptions(**bad)


def test_key_dict_leaves_out_runtime_and_foreign_options():
    a = BuildOptions(threads=4, cuda_graph=True, workspace_mb=64)
    b = BuildOptions()
    assert a.key_dict("onnxruntime") == b.key_dict("onnxruntime")
    assert a.key_dict("tensorrt") != b.key_dict("tensorrt")
    assert "calibration_sha256" in BuildOptions(precision="int8").key_dict("onnxruntime")


def test_describe_key_change_names_nested_parts():
    old = {"backend_version": "8.6.1", "device": {"gpu": "Orin", "l4t": "35.4.1"}, "x": 1}
    new = {"backend_version": "10.3.0", "device": {"gpu": "Orin", "l4t": "36.3.0"}, "x": 1}
    assert describe_key_change(old, new) == ["backend_version: 8.6.1 -> 10.3.0",
                                             "device.l4t: 35.4.1 -> 36.3.0"]


def test_jetson_release_parsing(tmp_path):
    assert l4t_release(TEGRA_36_3) == "36.3.0"
    assert l4t_release("garbage") is None
    assert parse_nvidia_smi("NVIDIA H100 80GB HBM3, 9.0\n") == {
        "name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    assert jetson_identity(tmp_path) is None  # not a Jetson
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nv_tegra_release").write_text(TEGRA_36_3)
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/model").write_bytes(b"NVIDIA Jetson AGX Orin Developer Kit\0")
    assert jetson_identity(tmp_path) == {"module": "NVIDIA Jetson AGX Orin Developer Kit",
                                         "l4t": "36.3.0"}
    assert device_slug({"kind": "cuda", "gpu": "Orin (nvgpu)", "compute_capability": "8.7"}) \
        == "cuda-sm87-orin-nvgpu"


def test_load_windows_npz_npy_and_errors(tmp_path):
    shape = (3, 10, 33, 2)
    a = np.random.default_rng(0).random((2, *shape), dtype=np.float32)
    b = np.random.default_rng(1).random((3, *shape)).astype(np.float64)
    np.savez(tmp_path / "w.npz", a=a, b=b, meta=np.arange(3))
    got = load_windows(tmp_path / "w.npz", shape)
    assert got.dtype == np.float32 and got.shape == (5, *shape)
    np.testing.assert_array_equal(got[:2], a)
    np.save(tmp_path / "w.npy", a)
    assert load_windows(tmp_path / "w.npy", shape).shape == (2, *shape)
    with pytest.raises(UserError, match="does not exist"):
        load_windows(tmp_path / "missing.npz", shape)
    a[0, 0, 0, 0, 0] = np.nan
    np.save(tmp_path / "nan.npy", a)
    with pytest.raises(UserError, match="NaN"):
        load_windows(tmp_path / "nan.npy", shape)


def test_compare_logits():
    ref = np.array([[1.0, 2.0], [3.0, 0.0], [0.0, 0.5], [2.0, 1.0]])
    got = np.array([[1.1, 2.0], [3.0, 0.0], [0.6, 0.5], [2.0, 1.0]])
    r = compare_logits(ref, got)
    assert r["windows"] == 4 and r["top1_agreement"] == 0.75
    assert r["max_abs_diff"] == pytest.approx(0.6)
    assert r["mean_abs_diff"] == pytest.approx(0.7 / 8)
    assert compare_logits(ref, np.full_like(got, np.nan))["finite"] is False
