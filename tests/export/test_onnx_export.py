"""Export + ONNX Runtime parity, on real-shaped windows: the export checked by the function the
caller passes (the store and `stgcnd export` pass `validate_export`), nothing written when
that check fails; and the CLI's user errors."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")  # an optional extra: pip install -e ".[torch]"

from stgcnd.engines.validate import ort_session, validate_export
from stgcnd.errors import UserError, ValidationError
from stgcnd.export.onnx_export import export_model
from stgcnd.model.reference import load_for_inference as load_model
from stgcnd.model.reference import reference_logits
from stgcnd.model.spec import ModelSpec
from stgcnd.model.synthetic import synthetic_windows
from tests.conftest import write_checkpoint

T = 30


def check_with_ort(model, dynamic_batch: bool = False):
    """The check the engine store and `stgcnd export` pass: ONNX Runtime against PyTorch."""
    return lambda data: validate_export(model, data, dynamic_batch)


@pytest.fixture(scope="module")
def original_path(tmp_path_factory, original_state):
    return write_checkpoint(tmp_path_factory.mktemp("orig") / "m.pt", original_state)


# The one export checked at the original's full widths (the others export the narrow network).
# M=5 costs five times M=1 on the CPU; more than one person is also exported (dynamic batch,
# M=2) in the fast tier.
@pytest.mark.parametrize("persons", [1, pytest.param(5, marks=pytest.mark.slow)])
def test_static_export_matches_pytorch(tmp_path, original_path, persons):
    model = load_model(ModelSpec(checkpoint=original_path, persons=persons, frames=T))
    res = export_model(model, tmp_path / "m.onnx", validate=check_with_ort(model))
    assert res.validation is not None and res.validation["max_abs_diff"] <= 1e-4
    assert res.validation["runtime"] == "onnxruntime-cpu"
    proto = onnx.load(str(res.onnx_path))
    assert proto.opset_import[0].version == 17
    inp = proto.graph.input[0]
    assert inp.name == "input"
    dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert dims == [1, 3, T, 33, persons]
    # An independent check with windows the exporter never saw, empty person slots included.
    x = synthetic_windows(3, T, persons, present=1, seed=99)
    sess = ort_session(res.onnx_path)
    got = np.concatenate([sess.run(None, {"input": w[None]})[0] for w in x])
    np.testing.assert_allclose(got, reference_logits(model, x), atol=1e-4)
    side = json.loads(res.sidecar_path.read_text())
    assert side["checkpoint_sha256"] == model.checkpoint_sha256
    assert side["onnx_sha256"] == res.onnx_sha256 and side["persons"] == persons
    assert side["validation"] == res.validation
    ops = {n.op_type for n in proto.graph.node}
    assert "AveragePool" not in ops and "ReduceMean" in ops


def test_dynamic_batch_1_to_8(tmp_path, checkpoint_path):
    model = load_model(ModelSpec(checkpoint=checkpoint_path, persons=2, frames=T))
    res = export_model(model, tmp_path / "dyn.onnx", dynamic_batch=True,
                       validate=check_with_ort(model, dynamic_batch=True))
    assert res.validation["max_abs_diff"] <= 1e-4
    sess = ort_session(res.onnx_path)
    x = synthetic_windows(8, T, 2, seed=5)
    ref = reference_logits(model, x)
    for n in range(1, 9):
        got = sess.run(None, {"input": x[:n]})[0]
        assert got.shape == (n, 2)
        np.testing.assert_allclose(got, ref[:n], atol=1e-4)


@pytest.mark.parametrize("graph_op", ["einsum", "matmul"])
def test_graph_op_choice_is_visible_in_graph(tmp_path, checkpoint_path, graph_op):
    model = load_model(ModelSpec(checkpoint=checkpoint_path, frames=T, graph_op=graph_op))
    res = export_model(model, tmp_path / f"{graph_op}.onnx")
    ops = [n.op_type for n in onnx.load(str(res.onnx_path)).graph.node]
    assert ops.count("Einsum") == (20 if graph_op == "einsum" else 0)


def test_optimized_export_matches(tmp_path, checkpoint_path):
    from stgcnd.model.optimized import optimize_for_export

    model = load_model(ModelSpec(checkpoint=checkpoint_path, frames=T))
    res = export_model(model, tmp_path / "opt.onnx", module=optimize_for_export(model),
                       variant="optimized", validate=check_with_ort(model))
    ops = [n.op_type for n in onnx.load(str(res.onnx_path)).graph.node]
    assert "BatchNormalization" not in ops
    assert res.validation["max_abs_diff"] <= 1e-4
    assert res.sidecar["variant"] == "optimized"


def test_without_a_check_nothing_is_validated(tmp_path, checkpoint_path):
    model = load_model(ModelSpec(checkpoint=checkpoint_path, frames=T))
    res = export_model(model, tmp_path / "m.onnx")
    assert res.validation is None and res.sidecar["validation"] is None
    assert json.loads(res.sidecar_path.read_text())["validation"] is None
    assert res.onnx_path.is_file()


def test_a_failed_check_writes_nothing(tmp_path, checkpoint_path):
    """A graph that is not the model's function (here: the demo model's graph, of the same
    interface but other weights) is refused by the check, and no file is left behind."""
    from stgcnd.export.demo_onnx import demo_onnx_bytes

    model = load_model(ModelSpec(checkpoint=checkpoint_path, frames=T))
    other = demo_onnx_bytes(ModelSpec(frames=T), dynamic_batch=False)
    with pytest.raises(ValidationError, match="differs from the reference"):
        export_model(model, tmp_path / "wrong.onnx", validate=check_with_ort(model),
                     data=other)
    assert list(tmp_path.iterdir()) == []
    seen: list[bytes] = []

    def refuse(data: bytes) -> dict:
        seen.append(data)
        raise ValidationError("not the same function")

    with pytest.raises(ValidationError, match="not the same function"):
        export_model(model, tmp_path / "m.onnx", validate=refuse)
    assert len(seen) == 1   # the check was given the exported graph itself
    assert onnx.load_from_string(seen[0]).graph.input[0].name == "input"
    assert list(tmp_path.iterdir()) == []


def test_output_must_be_onnx(tmp_path, checkpoint_path):
    model = load_model(ModelSpec(checkpoint=checkpoint_path, frames=T))
    with pytest.raises(UserError, match=r"\.onnx"):
        export_model(model, tmp_path / "m.bin")


def test_cli_export_and_user_errors(tmp_path, checkpoint_path, stgcnd_main):
    """What `stgcnd export` does and says, in process (a fresh interpreter per command cost
    seconds each and is no part of what is checked here)."""
    out = tmp_path / "engines" / "single.onnx"
    r = stgcnd_main("export", "--checkpoint", str(checkpoint_path), "--persons", "1",
                    "--frames", str(T), "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert "validated with ONNX Runtime" in r.stdout and out.is_file()
    # The README's command makes what a batching daemon needs (issue #31): a dynamic batch.
    assert json.loads(out.with_name(out.name + ".json").read_text())["dynamic_batch"] is True
    errors = [
        (["--checkpoint", str(tmp_path / "missing.pt")], "not found"),
        (["--checkpoint", str(checkpoint_path), "--layout", "openpose"], "33 joints"),
        (["--checkpoint", str(checkpoint_path), "--labels", "a", "b", "c"], "2 classes"),
        (["--persons", "0"], "persons must be >= 1"),
        (["--checkpoint", str(out)], "cannot read"),  # an ONNX file: no checkpoint
    ]
    for i, (bad, expect) in enumerate(errors):
        e = stgcnd_main("export", *bad, "--frames", str(T), "--output",
                        str(tmp_path / f"x{i}.onnx"))
        assert e.returncode == 2, (bad, e.stderr)
        last = e.stderr.strip().splitlines()[-1]
        assert last.startswith("stgcnd export: error:") and expect in last, e.stderr
        assert "Traceback" not in e.stderr
    r_int = stgcnd_main("export", "--persons", "one", "--output", "x.onnx")
    assert r_int.returncode == 2 and "invalid int value" in r_int.stderr


def test_every_command_has_help(stgcnd_main):
    from stgcnd.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert "export" in sub.choices
    for name in sub.choices:
        r = stgcnd_main(name, "--help")
        assert r.returncode == 0 and "usage: stgcnd" in r.stdout, name
