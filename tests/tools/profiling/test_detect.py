"""File kinds recognised from content, whatever the file is called."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from stgcnd.errors import UserError
from stgcnd_tools.profiling.detect import detect_kind, find_artefacts
from stgcnd_tools.profiling.parsefile import parse_path
from tests.tools.profiling.conftest import DATA, HANDMADE_KINDS, SHARED_KINDS


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


def _tail_from(log: Path, marker: str) -> str:
    lines = log.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if marker in line)
    return "".join(lines[start:])


@pytest.mark.parametrize("strip", ["", "timestamps", "levels"])
def test_pasted_log_starting_with_a_bracketed_line_is_a_log(tmp_path, strip):
    # What people paste from a terminal or a PR: the performance summary only, whose first
    # line starts with "[" like a JSON array does.
    text = _tail_from(DATA / "handmade_trt10.3_trtexec.log", "=== Performance summary ===")
    if strip == "timestamps":  # "[I] === Performance summary ===" (trtexec without timestamps)
        text = re.sub(r"^\[[0-9/:-]+\] ", "", text, flags=re.MULTILINE)
    elif strip == "levels":  # only the summary lines, no "&&&&" banner
        text = "".join(line for line in text.splitlines(keepends=True)
                       if not line.startswith("&&&&"))
    assert text.startswith("[")
    pasted = tmp_path / "pasted.txt"
    pasted.write_text("\n" + text)
    assert detect_kind(pasted) == "log"
    parsed = parse_path(pasted)["files"][0]
    assert parsed["kind"] == "log"
    summary = parsed["log"]["profile_metadata"]["performance_summary"]
    assert summary["throughput_qps"] == pytest.approx(796.302)
    assert summary["metrics_ms"]["gpu_compute_time"]["median"] == pytest.approx(1.2174)


def test_pasted_real_log_summary(shared, tmp_path):
    name = "nvidia_qat-ptq-notebook_mobilenetv2_fp32_trt8.2.5.trtexec.log"
    pasted = tmp_path / "summary.log"
    pasted.write_text(_tail_from(shared / name, "=== Performance summary ==="))
    assert pasted.read_text().startswith("[07/25/2022-16:43:25] [I] === Performance summary")
    assert detect_kind(pasted) == "log"


def test_json_arrays_are_still_json(tmp_path):
    # An empty or whitespace-led array of objects stays on the JSON side, and a bracketed line
    # that is not a trtexec log line stays unknown.
    (tmp_path / "empty.json").write_text("[\n]\n")
    (tmp_path / "spaced.json").write_text('[\n  { "count" : 3 }, {"name": "a", "timeMs": 1}]')
    (tmp_path / "note.txt").write_text("[draft] notes about a run\n")
    assert detect_kind(tmp_path / "empty.json") == "unknown"
    assert detect_kind(tmp_path / "spaced.json") == "profile"
    assert detect_kind(tmp_path / "note.txt") == "unknown"
