"""A model that quantizes its activations is checked at the "int8" tolerance
(tilefuse/compare.py): a rounding tie decided the other way moves a value by an 8-bit step,
so two correct runs may differ by that much; a plain float model is held to float's."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefuse.cli.main import main
from tilefuse.compare import compare_output
from tilefuse.frontend.qdq import checked_precision, is_quantized


def _model(activations: bool, in_branch: bool = False, weights: bool = True) -> onnx.ModelProto:
    """y = x @ DQ(W) (weights-only quantization), or with x itself quantized and
    dequantized first (in an If's branch where ``in_branch``); y = x @ W where not
    ``weights``."""
    w = numpy_helper.from_array(np.arange(-8, 8, dtype=np.int8).reshape(4, 4), "w_q")
    s = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    z = numpy_helper.from_array(np.array(128, np.uint8), "z")
    x = "x"
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "s"], ["w"])] if weights else []
    if not weights:
        w = numpy_helper.from_array(np.arange(-8, 8, dtype=np.float32).reshape(4, 4) * 0.05, "w")
    qdq = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"]),
           helper.make_node("DequantizeLinear", ["x_q", "s", "z"], ["x_dq"])]
    if activations and not in_branch:
        nodes += qdq
        x = "x_dq"
    if in_branch:
        out = helper.make_tensor_value_info("x_dq", TensorProto.FLOAT, [2, 4])
        then = helper.make_graph(qdq, "then", [], [out])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["x_dq"])], "else", [], [out])
        nodes += [helper.make_node("If", ["c"], ["x_b"], then_branch=then, else_branch=other)]
        x = "x_b"
    nodes += [helper.make_node("MatMul", [x, "w"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])]
    if in_branch:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [w, s, z])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def test_quantized_models_are_told_from_float_ones(tmp_path):
    assert is_quantized(_model(True, weights=False))
    assert is_quantized(_model(True, in_branch=True, weights=False))
    assert is_quantized(_model(False))  # quantized weights: onnxruntime quantizes what they multiply
    assert not is_quantized(_model(False, weights=False))
    path = tmp_path / "q.onnx"
    onnx.save(_model(True), path)
    assert checked_precision(path) == "int8"
    assert checked_precision(_model(False, weights=False)) == "fp32"
    assert checked_precision(_model(True), "bf16") == "bf16"  # already the looser
    assert checked_precision(_model(True), "fp16") == "int8"


def test_int8_tolerance_takes_a_step_and_no_more():
    rng = np.random.default_rng()
    want = rng.standard_normal(256).astype(np.float32) * 4
    scale = float(np.abs(want).max())
    small = np.argsort(np.abs(want))[:2]  # moved, they leave the scale as it is
    moved = want.copy()
    moved[small[0]] += 2 * (2 / 255) * scale  # two steps of an 8-bit range over +-scale
    assert not compare_output("y", moved, want).ok
    assert compare_output("y", moved, want, precision="int8").ok
    moved[small[1]] += 0.2 * scale
    assert not compare_output("y", moved, want, precision="int8").ok

    q = rng.integers(0, 256, 64).astype(np.uint8)
    one = q.copy()
    i = int(np.argmax(q < 254))
    one[i] += 1
    assert not compare_output("q", one, q).ok  # integers are exact...
    assert compare_output("q", one, q, precision="int8").ok  # ...but a quantized value may be a step off
    one[i] += 1
    assert not compare_output("q", one, q, precision="int8").ok


@pytest.mark.parametrize("activations,weights", [(True, True), (False, True), (False, False)])
def test_run_check_names_the_tolerance_it_used(activations, weights, tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_model(activations, weights=weights), path)
    assert main(["run", str(path), "--random", "--check"]) == 0
    out = capsys.readouterr().out
    want = "tolerance 0.03 x scale" if weights else "tolerance 0.0001 x scale"
    assert want in out, out
