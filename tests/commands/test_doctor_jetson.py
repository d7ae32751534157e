"""`stgcnd doctor` on a Jetson: L4T/JetPack, TensorRT, CUDA, and the fix for what is missing,
read from a root directory of real-format files (tests/commands/data/README.md). Nothing but
JetPack's own TensorRT and the driver is needed (no pycuda, no CUDA toolkit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stgcnd.board import l4t_release
from stgcnd_tools.doctor.checks import (
    dpkg_versions,
    jetson_stack,
    parse_nvcc_version,
)
from tests.conftest import REPO

DATA = Path(__file__).parent / "data"


def status_stanza(package: str, version: str) -> str:
    return (f"Package: {package}\nStatus: install ok installed\nPriority: standard\n"
            f"Section: metapackages\nInstalled-Size: 194\nMaintainer: NVIDIA Corporation\n"
            f"Architecture: arm64\nVersion: {version}\nDescription: {package}\n"
            " a continuation line of the description\n")


def make_root(tmp_path: Path, release: str, packages: dict[str, str],
              cuda_version: str | None, model: str = "NVIDIA Jetson Orin NX Engineering "
              "Reference Developer Kit") -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "nv_tegra_release").write_bytes((DATA / release).read_bytes())
    dt = root / "proc" / "device-tree"
    dt.mkdir(parents=True)
    (dt / "model").write_bytes(model.encode() + b"\x00")  # device-tree strings end in NUL
    dpkg = root / "var" / "lib" / "dpkg"
    dpkg.mkdir(parents=True)
    stanzas = [status_stanza(p, v) for p, v in packages.items()]
    stanzas.append("Package: removed-thing\nStatus: deinstall ok config-files\nVersion: 1\n")
    (dpkg / "status").write_text("\n".join(stanzas))
    if cuda_version:
        cuda = root / "usr" / "local" / "cuda"
        cuda.mkdir(parents=True)
        (cuda / "version.json").write_text(json.dumps(
            {"cuda": {"name": "CUDA SDK", "version": cuda_version},
             "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": cuda_version}},
            indent=3))
    return root


@pytest.mark.parametrize(("name", "expected"), [
    ("nv_tegra_release.r35.4.1", (35, "35.4.1")), ("nv_tegra_release.r35.2.1", (35, "35.2.1")),
    ("nv_tegra_release.r36.4.3", (36, "36.4.3")), ("nv_tegra_release.r38.2.0", (38, "38.2.0")),
    ("nv_tegra_release.r39.2.1", (39, "39.2.1")),
])
def test_real_release_lines(name, expected):
    assert l4t_release((DATA / name).read_text()) == expected[1]


def test_nvcc_and_dpkg_parsers():
    assert parse_nvcc_version((DATA / "nvcc-13.0.txt").read_text()) == "13.0.48"
    assert parse_nvcc_version("no compiler here") is None
    text = "\n".join([status_stanza("nvidia-jetpack", "5.1.2-b104"),
                      "Package: tensorrt\nStatus: deinstall ok config-files\nVersion: 8.5.2.2\n"])
    assert dpkg_versions(text, ("nvidia-jetpack", "tensorrt")) == {
        "nvidia-jetpack": "5.1.2-b104"}  # removed packages are not installed


def test_jetpack5_complete(tmp_path):
    root = make_root(tmp_path, "nv_tegra_release.r35.4.1",
                     {"nvidia-jetpack": "5.1.2-b104", "nvidia-l4t-core": "35.4.1-20230801124926",
                      "tensorrt": "8.5.2.2-1+cuda11.4"}, "11.4.315")
    got = jetson_stack(root, "3.8.10", {"tensorrt": "8.5.2.2"})
    assert got["l4t"] == "35.4.1" and got["jetpack"] == "5.1.2-b104"
    assert got["tensorrt_package"] == "8.5.2.2-1+cuda11.4" and got["cuda"] == "11.4.315"
    assert got["module"].startswith("NVIDIA Jetson Orin NX") and "\x00" not in got["module"]
    assert got["python"] == "3.8.10" and got["tensorrt_python"] == "8.5.2.2"
    assert got["problems"] == []
    assert "pycuda" not in json.dumps(got)


def test_jetpack5_fresh_venv_lists_each_fix(tmp_path):
    """A venv made without --system-site-packages, with Python 3.10."""
    root = make_root(tmp_path, "nv_tegra_release.r35.2.1",
                     {"nvidia-l4t-core": "35.2.1-20230124153320",
                      "tensorrt": "8.5.2.2-1+cuda11.4"}, "11.4.315")
    got = jetson_stack(root, "3.10.12", {"tensorrt": None})
    assert got["jetpack"] == "5.x (from L4T)"
    fixes = {p["what"].split(" ")[0]: p["fix"] for p in got["problems"]}
    assert set(fixes) == {"Python", "TensorRT"}
    assert "python3.8 -m venv --system-site-packages" in fixes["Python"]
    assert "--system-site-packages" in fixes["TensorRT"]
    assert "8.5.2.2-1+cuda11.4 is installed but not importable" in got["problems"][1]["what"]


def test_jetpack7_needs_only_its_tensorrt(tmp_path):
    """CUDA 13 (JetPack 7) needs nothing more: the driver layer is ctypes over libcuda."""
    root = make_root(tmp_path, "nv_tegra_release.r38.2.0",
                     {"nvidia-jetpack": "7.0-b128", "tensorrt": "10.13.3.9-1+cuda13.0"},
                     "13.0.48", model="NVIDIA Jetson AGX Thor Developer Kit")
    ok = jetson_stack(root, "3.12.3", {"tensorrt": "10.13.3.9"})
    assert ok["problems"] == [] and ok["cuda"] == "13.0.48"
    assert ok["jetpack"] == "7.0-b128" and ok["module"] == "NVIDIA Jetson AGX Thor Developer Kit"
    missing = jetson_stack(root, "3.12.3", {"tensorrt": None})
    assert [p["what"] for p in missing["problems"]] == [
        "TensorRT 10.13.3.9-1+cuda13.0 is installed but not importable from this Python"]


def test_jetpack6_without_cuda_toolkit_is_complete(tmp_path):
    """No nvcc is needed any more (pycuda was built with it): the toolkit is only reported."""
    root = make_root(tmp_path, "nv_tegra_release.r36.4.3", {"nvidia-jetpack": "6.2+b77"},
                     None)
    got = jetson_stack(root, "3.10.12", {"tensorrt": "10.3.0"})
    assert got["cuda"] is None
    assert got["problems"] == []


def test_tensorrt_not_installed_at_all(tmp_path):
    root = make_root(tmp_path, "nv_tegra_release.r36.4.3", {"nvidia-jetpack": "6.2+b77"},
                     "12.6.68")
    got = jetson_stack(root, "3.10.12", {"tensorrt": None})
    assert got["tensorrt_package"] is None
    assert [p["fix"] for p in got["problems"]] == [
        "sudo apt install nvidia-jetpack (or python3-libnvinfer)"]


def test_not_a_jetson(tmp_path):
    assert jetson_stack(tmp_path, "3.11.7", {"tensorrt": None}) is None


def test_doctor_prints_what_is_missing_and_the_fix(tmp_path, stgcnd_main):
    root = make_root(tmp_path, "nv_tegra_release.r35.4.1",
                     {"nvidia-jetpack": "5.1.2-b104", "tensorrt": "8.5.2.2-1+cuda11.4"},
                     "11.4.315")
    env = {"STGCND_ENGINE_DIR": str(tmp_path / "engines")}
    proc = stgcnd_main("doctor", "--root", str(root), env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "L4T 35.4.1, JetPack 5.1.2-b104" in out
    assert "package 8.5.2.2-1+cuda11.4" in out and "11.4.315" in out
    # This interpreter has no tensorrt: reported with its fix; nothing else is asked for.
    assert "MISSING   TensorRT 8.5.2.2-1+cuda11.4 is installed but not importable" in out
    assert "fix: recreate the venv with --system-site-packages" in out
    assert "pycuda" not in out
    report = json.loads(stgcnd_main("doctor", "--json", "--root", str(root), env=env,
                                    cwd=REPO).stdout)
    assert report["jetson"]["l4t"] == "35.4.1" and report["jetson"]["problems"]
    assert "pycuda" not in json.dumps(report)
