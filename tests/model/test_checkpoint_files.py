"""Files that are not checkpoints: the error says what the file is and what was expected."""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

torch = pytest.importorskip("torch")  # an optional extra: pip install -e ".[torch]"

from stgcnd.errors import CheckpointError
from stgcnd.model.reference import load_for_inference as load_model
from stgcnd.model.spec import ModelSpec
from tests.conftest import write_checkpoint

EXPECTED = r"expected an st-gcn state_dict.*origin_stream\.data_bn\.weight"


def error_for(path: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_model(ModelSpec(checkpoint=path))
    message = str(info.value)
    assert "\n" not in message and "KeyError" not in message
    return message


def test_list_tensor_and_empty_dict(tmp_path):
    torch.save([torch.zeros(2), torch.ones(3), 4], tmp_path / "list.pt")
    torch.save(torch.zeros(3, 4), tmp_path / "tensor.pt")
    torch.save({}, tmp_path / "empty_dict.pt")
    assert "holding a list of 3 items (Tensor, int)" in error_for(tmp_path / "list.pt")
    msg = error_for(tmp_path / "tensor.pt")
    assert "holding a single tensor of shape (3, 4)" in msg
    assert "holding an empty dict" in error_for(tmp_path / "empty_dict.pt")


def test_dict_without_tensors_lists_its_keys(tmp_path):
    torch.save({"epoch": 60, "lr": 0.01, "optimizer": "sgd"}, tmp_path / "meta.pt")
    msg = error_for(tmp_path / "meta.pt")
    assert "a dict with 3 keys (none of them tensors): epoch, lr, optimizer" in msg
    assert re.search(EXPECTED, msg)


def test_state_dict_under_another_key_says_how_to_resave(tmp_path, two_stream_state):
    torch.save({"epoch": 60, "net": two_stream_state}, tmp_path / "nested.pt")
    msg = error_for(tmp_path / "nested.pt")
    assert "its key 'net' holds 344 tensors" in msg and "torch.load(path)['net']" in msg


def test_tensors_of_another_model_are_counted_and_named(tmp_path):
    state = {f"layer{i}.weight": torch.zeros(1) for i in range(7)}
    msg = error_for(write_checkpoint(tmp_path / "other.pt", state))
    assert "found 7 tensors: layer0.weight, layer1.weight" in msg and ", …" in msg
    assert "found ," not in msg


@pytest.mark.parametrize(("content", "says"), [
    (b"hello world, this is a note\n" * 3, "a text file, not a PyTorch file: it starts with "
                                          "'hello world, this is a n"),
    (b"", "an empty file (0 bytes)"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 9\n", "git lfs pull"),
    (b"\x1f\x8b\x08\x00" + bytes(40), "gzip-compressed"),
    (bytes(range(200, 256)) * 4, "binary data starting with c8 c9 ca"),
])
def test_unreadable_bytes_are_described(tmp_path, content, says):
    path = tmp_path / "model.pt"
    path.write_bytes(content)
    msg = error_for(path)
    assert msg.startswith(f"cannot read {path}: it is ") and says in msg
    assert re.search(EXPECTED, msg)


def test_zip_archives(tmp_path, checkpoint_path):
    with zipfile.ZipFile(tmp_path / "docs.pt", "w") as archive:
        archive.writestr("notes/readme.txt", "hi")
    assert "a zip archive without data.pkl" in error_for(tmp_path / "docs.pt")
    assert "notes/readme.txt" in error_for(tmp_path / "docs.pt")
    np.savez(tmp_path / "windows.npz", x=np.zeros(2), y=np.ones(1))
    assert "a NumPy .npz archive (arrays: x, y)" in error_for(tmp_path / "windows.npz")
    cut = tmp_path / "cut.pt"
    cut.write_bytes(checkpoint_path.read_bytes()[:5000])
    assert "truncated or corrupt" in error_for(cut)


def test_numpy_and_plain_pickle(tmp_path):
    np.save(tmp_path / "arr.npy", np.zeros(3))
    assert "a NumPy .npy array" in error_for(tmp_path / "arr.npy")
    (tmp_path / "p.pkl").write_bytes(pickle.dumps({"a": 1}, protocol=2))
    assert "Python pickle" in error_for(tmp_path / "p.pkl")


@pytest.mark.parametrize("name", ["model.onnx", "exported.pt"])
def test_onnx_model_points_to_the_checkpoint(tmp_path, name):
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph, producer_name="pytorch"), tmp_path / name)
    msg = error_for(tmp_path / name)
    assert "an ONNX model" in msg and "stgcnd trtexec run --onnx" in msg
