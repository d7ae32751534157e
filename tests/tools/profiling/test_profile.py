"""exportProfile parsing on every real profile and the hand-made edge cases."""

from __future__ import annotations

import json

import pytest

from stgcnd.errors import UserError
from stgcnd_tools.profiling.layerinfo import load_layer_info
from stgcnd_tools.profiling.profile import load_profile
from tests.tools.profiling.conftest import DATA, shared_files


@pytest.mark.parametrize("name", shared_files("profile"))
def test_real_profiles(shared, name):
    raw = json.loads((shared / name).read_text())
    profile = load_profile(shared / name)
    records = [r for r in raw if "name" in r]
    assert profile.count == raw[0]["count"]
    assert not profile.repaired
    assert [la.name for la in profile.layers] == [r["name"] for r in records]
    assert profile.total_average_ms == pytest.approx(sum(r["averageMs"] for r in records))
    ranked = profile.to_dict()["per_layer"]
    assert [r["average_ms"] for r in ranked] == sorted((r["averageMs"] for r in records),
                                                       reverse=True)
    assert profile.has_median == ("medianMs" in records[0])
    assert sum(r["share_percent"] for r in ranked) == pytest.approx(100.0)
    # Our share is recomputed from averages; trtexec's percentage uses totals: close anyway.
    for row, record in zip(ranked, sorted(records, key=lambda r: -r["averageMs"])):
        assert row["share_percent"] == pytest.approx(record["percentage"], abs=0.05)


@pytest.mark.parametrize("stem", ["trex_tf-resnet50_rtx3090_fp32",
                                  "trex_mobilenetv2-qat_titanrtx",
                                  "fuzzylabs_resnet18_fp16_rtx3060_trt10"])
def test_profile_joined_with_layer_info_types(shared, stem):
    profile = load_profile(shared / f"{stem}.exportProfile.json")
    graph = json.loads((shared / f"{stem}.exportLayerInfo.json").read_text())
    type_by_name = {la["Name"]: la["LayerType"] for la in graph["Layers"]}
    rows = profile.to_dict(load_layer_info(shared / f"{stem}.exportLayerInfo.json")
                           .layer_types())["per_layer"]
    assert all(row["type"] == type_by_name[row["name"]] for row in rows)
    assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))


def test_unescaped_quotes_in_layer_names_are_repaired():
    path = DATA / "handmade_profile_unescaped_quote.json"
    with pytest.raises(json.JSONDecodeError):  # the fixture really is the broken form
        json.loads(path.read_text())
    profile = load_profile(path)
    assert profile.repaired
    assert profile.count == 120
    names = [la.name for la in profile.layers]
    assert names == ["Reformatting CopyNode for Input Tensor 0 to /gcn/Conv",
                     "/gcn/Conv + /gcn/Relu",
                     '/tcn/Einsum "A·x" (Unnamed Layer* 7) [Einsum]',
                     'C:\\path\\like "odd" name',
                     "/head/Gemm", "/head/Softmax"]
    assert [la.average_ms for la in profile.layers] == [0.015, 0.5, 0.3, 0.15, 0.06, 0.01]
    assert profile.layers[2].median_ms == 0.31
    assert profile.total_average_ms == pytest.approx(1.035)


def test_trt82_layout_without_median():
    profile = load_profile(DATA / "handmade_profile_trt82_no_median.json")
    assert not profile.has_median
    assert all(la.median_ms is None for la in profile.layers)
    ranked = profile.to_dict()["per_layer"]
    assert [r["name"] for r in ranked] == ["conv1 + relu1", "fc1", "pool1"]


def test_not_a_profile(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(UserError, match="exportProfile"):
        load_profile(path)
