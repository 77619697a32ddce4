"""Models with an ONNX If whose branches do different real work, for the frontend,
plan and end-to-end tests of control flow."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes, name, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def sum_switch_model(keepdims: int = 0) -> onnx.ModelProto:
    """y = x + If(ReduceSum(x) > 0, Sigmoid(Conv(x * x) + bias), Relu(x @ W)) on x
    [2, 3, 8, 8]; the branches read the outer x, weights, and a value computed before the
    If (x * x). ``keepdims=1`` makes the condition a [1, 1, 1, 1] tensor, not a scalar."""
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((3, 3, 3, 3)).astype(np.float32) * 0.3, "wc"),
        numpy_helper.from_array(rng.standard_normal((3,)).astype(np.float32), "bc"),
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.3, "wm"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    then_branch = helper.make_graph(
        [helper.make_node("Conv", ["x2", "wc", "bc"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Sigmoid", ["conv"], ["then_out"], name="sigmoid")],
        "then", [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2, 3, 8, 8])])
    else_branch = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wm"], ["mm"], name="matmul"),
         helper.make_node("Relu", ["mm"], ["else_out"], name="relu")],
        "else", [], [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [2, 3, 8, 8])])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=keepdims),
        helper.make_node("Greater", ["total", "zero"], ["positive"], name="greater"),
        helper.make_node("Mul", ["x", "x"], ["x2"], name="square"),
        helper.make_node("If", ["positive"], ["branch"], name="switch",
                         then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Add", ["branch", "x"], ["y"], name="residual"),
    ]
    return _model(nodes, "sum_switch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8, 8])], inits)


def sample_rate_model(else_shape: tuple[int, ...] = (1, 16, 32),
                      rate_shape: tuple[int, ...] = ()) -> onnx.ModelProto:
    """features = If(sample_rate == 16000, Relu(audio @ W), Tanh(audio * gain)) on audio
    [1, 16, 32] and a scalar int64 sample_rate, then features * 2.

    With ``else_shape`` (rank 3) other than the audio's, the else branch reshapes to it:
    branches of different output shapes, which only a bound sample_rate can specialise.
    ``rate_shape`` (1,) makes sample_rate a one-element tensor rather than a scalar."""
    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32) * 0.2, "w"),
        numpy_helper.from_array(np.array(1.5, np.float32), "gain"),
        numpy_helper.from_array(np.array(16000, np.int64), "rate16k"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(else_shape, np.int64), "else_shape"),
    ]
    then_branch = helper.make_graph(
        [helper.make_node("MatMul", ["audio", "w"], ["proj"], name="project"),
         helper.make_node("Relu", ["proj"], ["then_out"], name="relu")],
        "then", [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [1, 16, 32])])
    else_branch = helper.make_graph(
        [helper.make_node("Mul", ["audio", "gain"], ["scaled"], name="scale"),
         helper.make_node("Tanh", ["scaled"], ["squashed"], name="tanh"),
         helper.make_node("Reshape", ["squashed", "else_shape"], ["else_out"], name="reshape")],
        "else", [], [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, list(else_shape))])
    nodes = [
        helper.make_node("Equal", ["sample_rate", "rate16k"], ["is16k"], name="is16k"),
        helper.make_node("If", ["is16k"], ["features"], name="rate_switch",
                         then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Mul", ["features", "two"], ["y"], name="double"),
    ]
    inputs = [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 16, 32]),
              helper.make_tensor_value_info("sample_rate", TensorProto.INT64, list(rate_shape))]
    return _model(nodes, "sample_rate", inputs,
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["d0", "d1", "d2"])], inits)


def nested_switch_model(keepdims: int = 0) -> onnx.ModelProto:
    """An If inside an If's branch: y = If(sum(x) > 0, If(max(x) > 2, x @ W, Relu(x) - 1), -x).
    The inner branches read x and W from the outermost graph; ``keepdims`` as in
    ``sum_switch_model``."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.3, "w"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(2.0, np.float32), "limit"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
    ]
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, 8])  # noqa: E731
    inner_then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["it"], name="matmul")],
                                   "inner_then", [], [out("it")])
    inner_else = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                                    helper.make_node("Sub", ["r", "one"], ["ie"], name="minus_one")],
                                   "inner_else", [], [out("ie")])
    outer_then = helper.make_graph(
        [helper.make_node("ReduceMax", ["x"], ["peak"], name="peak", keepdims=keepdims),
         helper.make_node("Greater", ["peak", "limit"], ["tall"], name="tall"),
         helper.make_node("If", ["tall"], ["ot"], name="inner", then_branch=inner_then, else_branch=inner_else)],
        "outer_then", [], [out("ot")])
    outer_else = helper.make_graph([helper.make_node("Neg", ["x"], ["oe"], name="neg")], "outer_else", [], [out("oe")])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], name="sum", keepdims=keepdims),
        helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
        helper.make_node("If", ["positive"], ["y"], name="outer", then_branch=outer_then, else_branch=outer_else),
    ]
    return _model(nodes, "nested_switch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                  [out("y")], inits)


def shape_switch_model() -> onnx.ModelProto:
    """If(Shape(x)[0] == 2, Relu(x @ W), -x) on x [batch, 8]: the condition is shape
    arithmetic, known once batch is bound, so the frontend keeps only the branch taken."""
    rng = np.random.default_rng(4)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([0], np.int64), "first"),
        numpy_helper.from_array(np.array([2], np.int64), "two"),
    ]
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 8])  # noqa: E731
    then_branch = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
                                     helper.make_node("Relu", ["mm"], ["t"], name="relu")], "then", [], [out("t")])
    else_branch = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="neg")], "else", [], [out("e")])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "first"], ["batch"], name="batch"),
        helper.make_node("Equal", ["batch", "two"], ["is_two1"], name="is_two"),
        helper.make_node("Squeeze", ["is_two1"], ["is_two"], name="squeeze"),
        helper.make_node("If", ["is_two"], ["y"], name="batch_switch",
                         then_branch=then_branch, else_branch=else_branch),
    ]
    return _model(nodes, "shape_switch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                  [out("y")], inits)
