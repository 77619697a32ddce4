"""Composite ops and their spelled-out forms reach the compiler as the same primitives."""
import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from tilefuse.frontend import import_onnx


def _ops(nodes, inits, opset):
    g = h.make_graph(
        nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [2, 8])], [h.make_tensor_value_info("y", T.FLOAT, [2, 8])], inits
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return [n.op for n in import_onnx(m).nodes]


def test_layernorm_node_and_old_exporter_chain_give_identical_primitives():
    rng = np.random.default_rng()
    scale = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "s")
    bias = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    node = _ops([h.make_node("LayerNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)], [scale, bias], 17)
    # What torch's TorchScript exporter wrote before opset 17 (opset 13: axes attributes).
    consts = [numpy_helper.from_array(np.array(2.0, np.float32), "two"), numpy_helper.from_array(np.array(1e-5, np.float32), "eps")]
    chain = _ops(
        [
            h.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
            h.make_node("Sub", ["x", "m"], ["d"]),
            h.make_node("Pow", ["d", "two"], ["d2"]),
            h.make_node("ReduceMean", ["d2"], ["v"], axes=[-1]),
            h.make_node("Add", ["v", "eps"], ["ve"]),
            h.make_node("Sqrt", ["ve"], ["sd"]),
            h.make_node("Div", ["d", "sd"], ["n"]),
            h.make_node("Mul", ["n", "s"], ["ns"]),
            h.make_node("Add", ["ns", "b"], ["y"]),
        ],
        [scale, bias, *consts],
        13,
    )
    assert [str(op) for op in node] == [str(op) for op in chain]
    assert node == chain


def test_softmax_node_and_spelled_out_softmax_match():
    node = _ops([h.make_node("Softmax", ["x"], ["y"], axis=-1)], [], 13)
    chain = _ops(
        [
            h.make_node("ReduceMax", ["x"], ["m"], axes=[-1]),
            h.make_node("Sub", ["x", "m"], ["d"]),
            h.make_node("Exp", ["d"], ["e"]),
            h.make_node("ReduceSum", ["e", "ax"], ["s"]),
            h.make_node("Div", ["e", "s"], ["y"]),
        ],
        [numpy_helper.from_array(np.array([-1], np.int64), "ax")],
        13,
    )
    assert node == chain
