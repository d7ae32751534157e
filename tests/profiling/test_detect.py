"""File kinds recognised from content, whatever the file is called."""

from __future__ import annotations

import shutil

import pytest

from stgcnd.errors import UserError
from stgcnd.profiling.detect import detect_kind, find_artefacts
from tests.profiling.conftest import DATA, HANDMADE_KINDS, SHARED_KINDS


@pytest.mark.parametrize(("name", "kind"), sorted(SHARED_KINDS.items()))
def test_real_files(shared, tmp_path, name, kind):
    assert detect_kind(shared / name) == kind
    renamed = tmp_path / "artefact.bin"  # the name plays no part
    shutil.copyfile(shared / name, renamed)
    assert detect_kind(renamed) == kind


@pytest.mark.parametrize(("name", "kind"), sorted(HANDMADE_KINDS.items()))
def test_handmade_files(name, kind):
    assert detect_kind(DATA / name) == kind


def test_unknown_content(tmp_path, shared):
    (tmp_path / "a.json").write_text('{"hello": 1}')
    (tmp_path / "b.txt").write_text("just some text\n")
    (tmp_path / "c.engine").write_bytes(b"ftrt\x00\x00\x01\x02")
    assert {detect_kind(p) for p in tmp_path.iterdir()} == {"unknown"}
    # A document that quotes log markers mid-line is not a log.
    assert detect_kind(shared / "README.md") == "unknown"


def test_find_artefacts_prefers_canonical_names_and_rejects_ambiguity(tmp_path):
    shutil.copyfile(DATA / "handmade_trt10_times.json", tmp_path / "times.json")
    shutil.copyfile(DATA / "handmade_trt7_times.json", tmp_path / "old.json")
    shutil.copyfile(DATA / "handmade_trt11_layerinfo.json", tmp_path / "graph.json")
    found = find_artefacts(tmp_path)
    assert found == {"times": tmp_path / "times.json", "layer_info": tmp_path / "graph.json"}
    (tmp_path / "times.json").rename(tmp_path / "new.json")
    with pytest.raises(UserError, match="several times files"):
        find_artefacts(tmp_path)
