"""exportLayerInfo parsing: names-only and detailed forms, TensorRT 8.x/10.x/11.x schemas."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from stgcnd.errors import UserError
from stgcnd_tools.profiling.layerinfo import load_layer_info, precision_of
from tests.tools.profiling.conftest import DATA, shared_files


@pytest.mark.parametrize("name", shared_files("layer_info"))
def test_real_layer_info(shared, name):
    raw = json.loads((shared / name).read_text())
    info = load_layer_info(shared / name)
    assert len(info.layers) == len(raw["Layers"])
    assert info.schema == "8.x-10.x"
    assert [t["name"] for t in info.io_tensors] == raw["Bindings"]
    if isinstance(raw["Layers"][0], str):
        assert info.form == "names_only"
        assert [la.name for la in info.layers] == raw["Layers"]
        assert not info.type_counts()
    else:
        assert info.form == "detailed"
        assert info.type_counts() == Counter(la["LayerType"] for la in raw["Layers"])
        tactics = [la.get("TacticName") for la in raw["Layers"]]
        assert [la.tactic_name for la in info.layers] == tactics


def test_trt10_stream_and_metadata(shared):
    info = load_layer_info(shared / "fuzzylabs_resnet18_fp16_rtx3060_trt10.exportLayerInfo.json")
    assert {la.stream_id for la in info.layers} == {0}
    gemm = next(la for la in info.layers if la.layer_type == "kgen")
    assert gemm.metadata == "[ONNX Layer: /fc/Gemm]"
    # Read by hand from the file: every layer's first output is an FP16 format or "Half",
    # except the shape_call layer, which has no outputs.
    assert info.precision_counts() == Counter({"FP16": 25})


def test_int8_qdq_precisions(shared):
    raw = json.loads((shared / "trex_mobilenetv2-qat_titanrtx.exportLayerInfo.json").read_text())
    info = load_layer_info(shared / "trex_mobilenetv2-qat_titanrtx.exportLayerInfo.json")
    int8_outputs = sum(1 for la in raw["Layers"]
                       if "Int8" in la["Outputs"][0]["Format/Datatype"])
    assert info.precision_counts()["INT8"] == int8_outputs > 0
    assert info.layers[0].origin == "QDQ"


def test_trt11_io_tensors_and_split_format():
    info = load_layer_info(DATA / "handmade_trt11_layerinfo.json")
    assert info.schema == "11.x"
    assert info.form == "detailed"
    assert info.io_tensors == [
        {"name": "input", "mode": "Input", "dtype": "Float", "dims": [1, 3, 150, 33, 1],
         "location": "Device"},
        {"name": "logits", "mode": "Output", "dtype": "Float", "dims": [1, 60],
         "location": "Device"}]
    assert [la.output_precision for la in info.layers] == ["FP16", "FP16", "FP32"]
    assert [la.stream_id for la in info.layers] == [0, 0, 1]
    assert info.layers[1].metadata == "[ONNX Layer: /gcn/Conv]; [ONNX Layer: /gcn/Relu]"


def test_count_types_reports_zeros(shared):
    info = load_layer_info(shared / "trex_tf-resnet50_rtx3090_fp32.exportLayerInfo.json")
    assert info.count_types(["CaskConvolution", "Einsum", "matmul"]) == {
        "CaskConvolution": 53, "Einsum": 0, "matmul": 0}


@pytest.mark.parametrize(("text", "expected"), [
    ("Row major linear FP32", "FP32"), ("Channel major FP16 format where channel % 4 == 0",
                                        "FP16"),
    ("Four wide channel vectorized row major Int8 format", "INT8"), ("Half", "FP16"),
    ("Float", "FP32"), ("Int32", "INT32"), ("BFloat16", "BF16"), ("", None),
])
def test_precision_of(text, expected):
    assert precision_of(text) == expected


def test_not_layer_info(tmp_path):
    path = tmp_path / "l.json"
    path.write_text('{"Bindings": []}')
    with pytest.raises(UserError, match="exportLayerInfo"):
        load_layer_info(path)
