"""Which ONNX exporter `torch.onnx.export` is asked for, across torch releases (no torch needed).

torch 2.5+ takes `dynamo=` and newer releases default it to True; JetPack 5's torch 2.0/2.1
has no such keyword, and passing it there was a TypeError on the first user's first export.
The functions below have those two signatures (the leading parameters as torch spells them).
"""

from __future__ import annotations

from stgcnd.export.onnx_export import torchscript_exporter


def export_torch_2_1(model, args, f, export_params=True, verbose=False, training=None,
                     input_names=None, output_names=None, operator_export_type=None,
                     opset_version=None, do_constant_folding=True, dynamic_axes=None,
                     keep_initializers_as_inputs=None, custom_opsets=None,
                     export_modules_as_functions=False):
    return None


def export_torch_2_9(model, args=(), f=None, *, kwargs=None, export_params=True,
                     verbose=None, input_names=None, output_names=None, opset_version=None,
                     dynamic_axes=None, do_constant_folding=True, dynamo=True,
                     **deprecated):
    return None


def test_old_torch_gets_no_dynamo_keyword():
    assert torchscript_exporter(export_torch_2_1) == {}


def test_new_torch_is_asked_for_the_torchscript_exporter():
    assert torchscript_exporter(export_torch_2_9) == {"dynamo": False}


def test_something_without_a_signature_is_taken_as_the_old_api():
    assert torchscript_exporter(object()) == {}
