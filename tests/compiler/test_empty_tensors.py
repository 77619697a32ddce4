"""Tensors with a dim of 0 (an empty batch, K of 0, no columns) compile and run like
onnxruntime: empty outputs stay empty, products over an empty K are zeros, reductions over
nothing give their identity. They used to end in a ValueError or ZeroDivisionError inside
the lowering. CUDA: the same groups lower and emit (compiled for sm_90a elsewhere)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.partition.kinds import FusionKind
from tilefuse.runtime import InferenceSession
from tilefuse.target import CUDA_SM90A
from tilefuse.tile_ir import lower_group

F = TensorProto.FLOAT


def _model(nodes, ins, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in ins],
                          [helper.make_tensor_value_info("y", F, None)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    inferred = onnx.shape_inference.infer_shapes(m)
    del m.graph.output[:]
    m.graph.output.extend(inferred.graph.output)
    return m


def _w(rng, *shape, name="w"):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _cases(rng):
    mm = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    axis = numpy_helper.from_array(np.array([1], np.int64), "ax")
    return {
        "matmul-m0": _model(mm, [("x", [0, 8])], [_w(rng, 8, 16)]),
        "matmul-k0": _model(mm, [("x", [4, 0])], [_w(rng, 0, 16)]),
        "matmul-n0": _model(mm, [("x", [4, 8])], [_w(rng, 8, 0)]),
        "batch0-relu": _model([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Relu", ["p"], ["y"])],
                              [("x", [0, 3, 8])], [_w(rng, 8, 16)]),
        "gemm-bias-m0": _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], [("x", [0, 8])],
                               [_w(rng, 16, 8), _w(rng, 16, name="b")]),
        "k0-residual": _model([helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "r"], ["y"])],
                              [("x", [4, 0]), ("r", [4, 16])], [_w(rng, 0, 16)]),
        "reducesum-over-nothing": _model([helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)], [("x", [4, 0])],
                                         [axis]),
        "softmax-no-rows": _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", [0, 8])]),
        "conv-batch0": _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [("x", [0, 3, 8, 8])],
                              [_w(rng, 4, 3, 3, 3)]),
    }


CASES = sorted(_cases(np.random.default_rng(0)))


@pytest.mark.parametrize("name", CASES)
def test_empty_tensors_match_onnxruntime(name):
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    model = _cases(rng)[name]
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = InferenceSession(tilefuse.compile(model.SerializeToString())).run(None, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if name == "matmul-k0":
        assert want.shape == (4, 16) and not want.any()  # the case must test zeros over an empty K
    graph = import_onnx(model)
    for g in partition_graph(graph, CUDA_SM90A).groups:
        if g.kind is not FusionKind.OPAQUE:
            assert emit_tilelang(lower_group(g, CUDA_SM90A).program).text
