"""TensorRT's full Debian package versions in the cache key (issue #11.2)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from stgcnd.engines.device import (
    _DPKG_FORMAT,
    TENSORRT_DPKG_PATTERNS,
    dpkg_packages,
    parse_dpkg_packages,
    runtime_identity,
)
from stgcnd.engines.keys import describe_key_change, key_digest, make_key_parts

# `dpkg-query -W -f '${Package}\t${Version}\t${db:Status-Abbrev}\n' 'libc6*'` on this Debian
# 12 machine, verbatim: installed packages ('ii') and ones dpkg only knows of ('un', no version).
DEBIAN_OUTPUT = ("libc6\t2.36-9+deb12u14\tii \nlibc6-amd64\t\tun \n"
                 "libc6-dbg\t2.36-9+deb12u14\tii \nlibc6-dbgsym\t\tun \n"
                 "libc6-dev\t2.36-9+deb12u14\tii \nlibc6-dev-amd64-cross\t\tun \n")
# The same query's shape on JetPack 5.1 (Orin NX, L4T R35.4.1, TensorRT 8.5.2): written from
# the package names and versions JetPack installs, not captured (no Jetson here).
JETPACK5_OUTPUT = ("libnvinfer-plugin8\t8.5.2-1+cuda11.4\tii \n"
                   "libnvinfer8\t8.5.2-1+cuda11.4\tii \n"
                   "libnvonnxparsers8\t8.5.2-1+cuda11.4\tii \n"
                   "libnvinfer7\t\tun \n"
                   "libnvinfer10\t10.3.0.30-1+cuda12.5\trc \n")  # removed, config kept


def test_parses_real_dpkg_output():
    assert parse_dpkg_packages(DEBIAN_OUTPUT) == {
        "libc6": "2.36-9+deb12u14", "libc6-dbg": "2.36-9+deb12u14",
        "libc6-dev": "2.36-9+deb12u14"}


def test_only_installed_tensorrt_packages_count():
    assert parse_dpkg_packages(JETPACK5_OUTPUT) == {
        "libnvinfer-plugin8": "8.5.2-1+cuda11.4", "libnvinfer8": "8.5.2-1+cuda11.4",
        "libnvonnxparsers8": "8.5.2-1+cuda11.4"}
    assert parse_dpkg_packages("") == {}
    assert parse_dpkg_packages("dpkg-query: no packages found matching x\n") == {}


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg here")
def test_format_is_what_dpkg_query_prints_here():
    """The format string really produces the lines the parser reads (dpkg itself is run)."""
    out = subprocess.run(["dpkg-query", "-W", "-f", _DPKG_FORMAT, "dpkg"],
                         capture_output=True, text=True, check=True).stdout
    parsed = parse_dpkg_packages(out)
    assert list(parsed) == ["dpkg"] and parsed["dpkg"][0].isdigit()


def test_no_tensorrt_packages_means_no_key_part():
    """Here (no libnvinfer package) the key is what it was, for every backend."""
    assert dpkg_packages(*TENSORRT_DPKG_PATTERNS) == {}  # dpkg-query exits 1 for no match: handled
    assert runtime_identity("tensorrt") == {} and runtime_identity("onnxruntime") == {}
    base = dict(onnx_sha256="a" * 64, backend="tensorrt", backend_version="8.5.2.2",
                device={"kind": "cuda"}, options={}, input_shape=[3, 150, 33, 1],
                batch_range=[1, 1])
    assert "runtime" not in make_key_parts(**base, runtime={})


def test_package_rebuild_changes_the_key_and_says_so():
    base = dict(onnx_sha256="a" * 64, backend="tensorrt", backend_version="8.5.2.2",
                device={"kind": "cuda"}, options={}, input_shape=[3, 150, 33, 1],
                batch_range=[1, 1])
    old = make_key_parts(**base, runtime={"packages": parse_dpkg_packages(JETPACK5_OUTPUT)})
    newer = JETPACK5_OUTPUT.replace("libnvinfer8\t8.5.2-1+cuda11.4",
                                    "libnvinfer8\t8.5.2-2+cuda11.4")
    new = make_key_parts(**base, runtime={"packages": parse_dpkg_packages(newer)})
    assert key_digest(old) != key_digest(new)
    assert describe_key_change(old, new) == [
        "runtime.packages.libnvinfer8: 8.5.2-1+cuda11.4 -> 8.5.2-2+cuda11.4"]
