"""The partition verifier catches broken partitions (built by hand from a real one)."""
import numpy as np
import pytest

from tilefuse.errors import GraphError
from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.partition import FusedGroup, Partition, partition_graph, verify_partition
from tilefuse.partition.kinds import FusionKind
from tilefuse.target import CPU


def _mlp_graph():
    rng = np.random.default_rng()
    b = Builder("mlp")
    x = b.input("x", TensorType(DType.FLOAT32, (4, 8)))
    h = b.matmul(x, b.const(rng.standard_normal((8, 8)).astype(np.float32)))
    h = b.map(ScalarFn.MAX, b.map(ScalarFn.ADD, h, b.const(rng.standard_normal(8).astype(np.float32))), b.const(np.float32(0)))
    # The second product's right operand is an input: not a weight chain, so two kernels.
    y = b.matmul(h, b.input("w", TensorType(DType.FLOAT32, (8, 8))))
    s = b.reduce(ReduceFn.SUM, y, [1], keepdims=True)
    b.output("y", b.map(ScalarFn.DIV, y, s))
    return b.graph


def test_mlp_groups():
    p = partition_graph(_mlp_graph(), CPU)
    assert [g.kind for g in p.groups] == [FusionKind.CONTRACTION, FusionKind.CONTRACTION]
    assert [n.op.name for n in p.groups[0].nodes] == ["MatMul", "add", "max"]


def _copy(p, groups):
    return Partition(p.graph, p.target, groups, p.refusals)


def test_node_in_two_groups():
    p = partition_graph(_mlp_graph(), CPU)
    g0, g1 = p.groups
    dup = FusedGroup(g1.id, g1.nodes + (g0.nodes[-1],), g1.kind, g1.inputs, g1.outputs, g1.cost)
    with pytest.raises(GraphError, match="in groups"):
        verify_partition(_copy(p, [g0, dup]))


def test_node_in_no_group():
    p = partition_graph(_mlp_graph(), CPU)
    with pytest.raises(GraphError, match="in no group"):
        verify_partition(_copy(p, p.groups[:1]))


def test_groups_out_of_order():
    p = partition_graph(_mlp_graph(), CPU)
    with pytest.raises(GraphError, match="later group"):
        verify_partition(_copy(p, p.groups[::-1]))


def test_boundary_mismatch():
    p = partition_graph(_mlp_graph(), CPU)
    g0, g1 = p.groups
    wrong = FusedGroup(g0.id, g0.nodes, g0.kind, g0.inputs, (), g0.cost)
    with pytest.raises(GraphError, match="boundary"):
        verify_partition(_copy(p, [wrong, g1]))


def test_non_convex_split_is_caught():
    """Splitting a group so that a path leaves and re-enters shows up as an order error."""
    p = partition_graph(_mlp_graph(), CPU)
    g0, g1 = p.groups
    # Move the relu (last of g0) to the end: g0 -> g1 reads it before it exists.
    nodes = g0.nodes[:-1]
    from tilefuse.partition.grow import Grower

    gr = Grower(p.graph, CPU)
    a = FusedGroup(0, nodes, g0.kind, (), tuple(gr.outputs_of(list(nodes))), g0.cost)
    b = FusedGroup(1, g1.nodes + (g0.nodes[-1],), g1.kind, (), (), g1.cost)
    with pytest.raises(GraphError):
        verify_partition(_copy(p, [a, b]))
