"""Graph IR: building, folding, verification, printing, algorithms (no onnx needed)."""
import numpy as np
import pytest

from tilefuse.errors import GraphError
from tilefuse.ir import Builder, DType, TensorType, format_graph, verify_graph
from tilefuse.ir.algorithms import is_convex, reachable, topological_order
from tilefuse.ir.prims import Kind, Map, MatMul, ReduceFn, ScalarFn
from tilefuse.reference import run_graph


def _softmax_graph() -> Builder:
    b = Builder("softmax")
    x = b.input("x", TensorType(DType.FLOAT32, (2, 8)))
    m = b.reduce(ReduceFn.MAX, x, [1], keepdims=True)
    e = b.map(ScalarFn.EXP, b.map(ScalarFn.SUB, x, m))
    s = b.reduce(ReduceFn.SUM, e, [1], keepdims=True)
    b.output("y", b.map(ScalarFn.DIV, e, s))
    return b


def test_build_verify_and_run_matches_numpy():
    b = _softmax_graph()
    verify_graph(b.graph)
    x = np.random.default_rng().standard_normal((2, 8)).astype(np.float32)
    y = run_graph(b.graph, {"x": x})["y"]
    want = np.exp(x - x.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    assert [n.op.kind for n in b.graph.nodes] == [Kind.REDUCE, Kind.MAP, Kind.MAP, Kind.REDUCE, Kind.MAP]


def test_def_use_links():
    g = _softmax_graph().graph
    x = g.inputs[0]
    assert [u.op.name for u in x.users] == ["reduce_max", "sub"]
    for node in g.nodes:
        for v in node.outputs:
            assert v.producer is node


def test_constant_expressions_fold():
    b = Builder("fold")
    a = b.const(np.arange(6, dtype=np.int64))
    c = b.map(ScalarFn.MUL, a, b.const(np.int64(2)))
    assert c.is_constant and c.producer is None
    np.testing.assert_array_equal(c.data, np.arange(6) * 2)
    assert not b.graph.nodes


def test_large_broadcast_of_a_scalar_is_not_folded():
    b = Builder("nofold")
    big = b.broadcast(b.const(np.float32(1)), (512, 512))
    assert not big.is_constant and len(b.graph.nodes) == 1


def test_verifier_rejects_wrong_output_type():
    b = _softmax_graph()
    b.graph.nodes[1].outputs[0].type = TensorType(DType.FLOAT16, (2, 8))
    with pytest.raises(GraphError, match="primitive infers"):
        verify_graph(b.graph)


def test_verifier_rejects_use_before_definition():
    b = _softmax_graph()
    b.graph.nodes.reverse()
    with pytest.raises(GraphError, match="before it is defined"):
        verify_graph(b.graph)


def test_verifier_rejects_broken_def_use():
    b = _softmax_graph()
    b.graph.inputs[0].users.clear()
    with pytest.raises(GraphError, match="does not list its user"):
        verify_graph(b.graph)


def test_type_errors_are_raised_at_construction():
    b = Builder("bad")
    x = b.input("x", TensorType(DType.FLOAT32, (2, 3)))
    y = b.input("y", TensorType(DType.FLOAT32, (4, 5)))
    with pytest.raises(ValueError, match="inner dims"):
        b.matmul(x, y)
    z = b.input("z", TensorType(DType.INT64, (2, 3)))
    with pytest.raises(TypeError, match="dtypes differ"):
        b.map(ScalarFn.ADD, x, z)
    with pytest.raises(ValueError, match="do not broadcast"):
        b.map(ScalarFn.ADD, x, y)


def test_printer_shows_types_and_constants():
    text = format_graph(_softmax_graph().graph)
    assert "%x: float32[2,8]" in text
    assert "reduce_max(axes=(1,), keepdims=True)" in text
    assert "return y=" in text


def test_algorithms_order_reachability_convexity():
    g = _softmax_graph().graph
    order = topological_order(g)
    assert order == g.nodes
    first = g.nodes[0]
    assert reachable(g, first) == set(g.nodes[1:])
    assert is_convex(g, g.nodes[:3])
    # {reduce_max, div} without the path between them (sub, exp, reduce_sum) is not convex.
    assert not is_convex(g, [g.nodes[0], g.nodes[4]])


def test_dead_nodes_are_removed():
    b = _softmax_graph()
    x = b.graph.inputs[0]
    b.map(ScalarFn.NEG, x)  # unused
    assert b.graph.remove_dead_nodes() == 1
    assert all(u in b.graph.nodes for u in x.users)
    verify_graph(b.graph)


def test_primitives_are_values():
    assert Map(ScalarFn.ADD) == Map(ScalarFn.ADD)
    assert hash(MatMul()) == hash(MatMul())
    with pytest.raises(ValueError):
        Map(ScalarFn.ADD, to=DType.FLOAT16)


def test_all_dtypes_roundtrip_numpy():
    for dt in DType:
        assert DType.from_numpy(dt.numpy) is dt
    assert DType.BFLOAT16.itemsize == 2 and DType.BFLOAT16.compute is DType.FLOAT32
