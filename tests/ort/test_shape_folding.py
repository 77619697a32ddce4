"""export-ort folds shape arithmetic across regions as `optimize` folds it in the whole
model: a value computed from a bound shape (Shape -> Gather -> Concat) in one region is a
constant for the regions after a node onnxruntime keeps, so a Reshape there still becomes
a tilefuse kernel instead of staying (with everything after it) on onnxruntime."""
from __future__ import annotations

import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.ort.helpers import computed_ops, export_session, reference
from tilefuse.compare import compare_output
from tilefuse.compiler import compile_model
from tilefuse.ort import export_ort
from tilefuse.partition.kinds import FusionKind



def shape_after_kept_model() -> onnx.ModelProto:
    """CumSum (a host step, so onnxruntime keeps it) splits the model: Shape -> Gather ->
    Concat runs before it, the Reshape reading that shape after it."""
    axis = numpy_helper.from_array(np.array(1, np.int64), "axis")
    zero = numpy_helper.from_array(np.array([0], np.int64), "zero")
    minus_one = numpy_helper.from_array(np.array([-1], np.int64), "minus_one")
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
        helper.make_node("Gather", ["x_shape", "zero"], ["batch"], name="gather", axis=0),
        helper.make_node("Concat", ["batch", "minus_one"], ["target"], name="concat", axis=0),
        helper.make_node("CumSum", ["x", "axis"], ["c"], name="cumsum"),
        helper.make_node("Reshape", ["c", "target"], ["flat"], name="reshape"),
        helper.make_node("Relu", ["flat"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "shape_after_kept", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 12])], [axis, zero, minus_one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _host_nodes(path, shapes) -> set[str]:
    """The ONNX nodes `optimize` runs as host steps: what export-ort may leave to onnxruntime."""
    compiled = compile_model(path, "cpu", shapes)
    return {n.origin for g in compiled.partition.groups if g.kind is FusionKind.OPAQUE for n in g.nodes}


@pytest.mark.parametrize("mode", ["ep", "custom-ops"])
def test_reshape_after_a_kept_node_reads_a_folded_shape(mode, tmp_path, ep_options):
    path = tmp_path / "m.onnx"
    onnx.save(shape_after_kept_model(), str(path))
    result = export_ort(path, tmp_path / "out", "cpu", {"batch": 5}, mode)
    assert [k.name for k in result.kept] == ["cumsum"]  # the Reshape after it is claimed
    assert computed_ops(result) == ["CumSum"]
    seed = random.randrange(2**31)
    x = np.random.default_rng(seed).standard_normal((5, 3, 4)).astype(np.float32)
    (got,) = export_session(result, ep_options).run(None, {"x": x})
    c = compare_output("y", got, reference(path, {"x": x})["y"])
    assert c.ok, f"seed={seed}: {c.problem}"


# ------------------------------------------------------------------ a real export

ROBERTA_SHAPES = {"batch": 2, "seq": 16}


@pytest.fixture(scope="module")
def roberta_path(tmp_path_factory):
    """A tiny RoBERTa from transformers, dynamo-exported with dynamic batch and seq. Its
    position ids are a CumSum over the padding mask, which export-ort leaves to
    onnxruntime; the attention's Reshapes after it read Concats of Shape(attention_mask)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from models.export import export_dynamo
    from models.transformers_zoo import TextWrapper, perturb_constant_parameters

    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128, max_position_embeddings=66,
                                        attn_implementation="eager")
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        model = transformers.RobertaModel(config)
    finally:
        transformers.logging.set_verbosity(verbosity)
    perturb_constant_parameters(model)
    module = TextWrapper(model, ("last_hidden_state", "pooler_output")).eval()
    ids = torch.randint(2, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=64)
    proto = export_dynamo(module, (ids, mask), ["input_ids", "attention_mask"],
                          ["last_hidden_state", "pooler_output"], ({0: batch, 1: seq}, {0: batch, 1: seq}))
    path = tmp_path_factory.mktemp("roberta") / "roberta.onnx"
    onnx.save(proto, str(path))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ep", "custom-ops"])
def test_roberta_export_leaves_only_what_optimize_runs_on_the_host(mode, roberta_path, tmp_path, ep_options):
    result = export_ort(roberta_path, tmp_path, "cpu", ROBERTA_SHAPES, mode)
    host = _host_nodes(roberta_path, ROBERTA_SHAPES)
    assert host  # the CumSum of the position ids
    assert {k.name for k in result.kept} == host, result.summary()
    assert len(computed_ops(result)) == len(host)
    assert result.kernel_nodes >= 10
    seed = random.randrange(2**31)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 100, (2, 16), dtype=np.int64)
    mask = np.ones((2, 16), np.int64)
    mask[1, 11:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    sess = export_session(result, ep_options)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    want = reference(roberta_path, feeds)
    assert set(got) == set(want)
    for name, w in want.items():
        c = compare_output(name, got[name], w)
        assert c.ok, f"seed={seed}: {name}: {c.problem}"
