"""The oldest torch stgcnd supports, judged from version strings as torch and NVIDIA spell them."""

from __future__ import annotations

import pytest

from stgcnd.versions import TORCH_FLOOR, torch_unusable


@pytest.mark.parametrize("version", [
    "2.0.0+nv23.05",              # NVIDIA's Jetson wheels for Python 3.8 (JetPack 5.1.x)
    "2.1.0a0+41361538.nv23.06",   # a pre-release, still 2.1
    "2.0.1+cu117",                # what CI's Python 3.8 stage installs
    "2.13.0+cpu",
    "10.0",
])
def test_supported_torch_is_accepted(version):
    assert torch_unusable(version) is None


@pytest.mark.parametrize("version", [
    "1.14.0a0+44dac51c.nv23.01",  # an earlier NVIDIA Jetson wheel for Python 3.8
    "1.13.0",
    "1.9.0",
])
def test_older_torch_is_refused_with_the_fix(version):
    reason = torch_unusable(version)
    assert reason is not None
    assert version in reason and f"{TORCH_FLOOR[0]}.{TORCH_FLOOR[1]}" in reason
    assert "JetPack" in reason and "stgcnd[torch]" in reason


def test_the_installed_torch_is_read_without_importing_it():
    import sys

    had = "torch" in sys.modules
    torch_unusable()
    assert ("torch" in sys.modules) == had
