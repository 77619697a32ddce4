"""Index checks in the tile IR (tile_ir/lower/checks.py): which indices get a check site,
what each site says, and what a checked index does in the interpreter (the oracle the
code generators are tested against)."""
import numpy as np
import pytest

from tilefuse.errors import GraphError
from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import Gather, GatherND, ScalarFn
from tilefuse.partition import partition_graph
from tilefuse.target import CPU
from tilefuse.tile_ir import format_program, lower_group, run_program
from tilefuse.tile_ir.interpret import TileInterpreterError
from tilefuse.tile_ir.ir import IndexCheck, Load, Store, TileProgram, Var
from tilefuse.tile_ir.verify import verify_program

F32, I32, I64 = DType.FLOAT32, DType.INT32, DType.INT64


def _lookup_graph():
    """table[ids] + table2[(ids32 as int64) + 1] + data3[coords] (a GatherND), and a Gather
    with constant indices: one group of four index reads, three of them at run time."""
    rng = np.random.default_rng(0)
    b = Builder("lookup")
    ids = b.input("ids", TensorType(I64, (6,)))
    ids32 = b.input("ids32", TensorType(I32, (6,)))
    coords = b.input("coords", TensorType(I64, (6, 2)))
    b.origin = "emb"
    x = b.emit1(Gather(0), b.const(rng.standard_normal((10, 4)).astype(np.float32)), ids)
    b.origin = "pos"
    shifted = b.map(ScalarFn.ADD, b.cast(ids32, I64), b.const(np.int64(1)))
    y = b.emit1(Gather(0), b.const(rng.standard_normal((7, 4)).astype(np.float32)), shifted)
    b.origin = "nd"
    z = b.emit1(GatherND(0), b.input("grid", TensorType(F32, (3, 5, 4))), coords)
    b.origin = "fixed"
    w = b.emit1(Gather(0), b.input("small", TensorType(F32, (2, 4))), b.const(np.array([1, -2, 0, 1, 1, 0], np.int64)))
    b.origin = ""
    b.output("out", b.map(ScalarFn.ADD, b.map(ScalarFn.ADD, x, y), b.map(ScalarFn.ADD, z, w)))
    return b.graph


def _one_group(graph):
    (group,) = [g for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    return group


def test_every_index_read_at_run_time_gets_a_site_in_node_order():
    low = lower_group(_one_group(_lookup_graph()), CPU)
    assert [(s.what, s.extent) for s in low.sites] == [
        ("input 'ids' (the indices of Gather node 'emb')", 10),
        ("the indices of Gather node 'pos'", 7),  # computed from ids32: no graph input holds it
        ("input 'coords' (coordinate 0 of the indices of GatherND node 'nd')", 3),
        ("input 'coords' (coordinate 1 of the indices of GatherND node 'nd')", 5),
    ]  # the constant indices of 'fixed' were checked when lowered: no site
    assert low.program.index_sites == 4
    text = format_program(low.program)
    assert "status: T.Tensor([2], int64)  # 4 index checks" in text
    assert all(f"check_index<{k}>" in text for k in range(4))


def _args(low, feeds, graph):
    by_name = {v.name: v for v in graph.inputs}
    n_in = low.program.num_inputs
    args = [np.ascontiguousarray(v.data if v.is_constant else feeds[v.name]) for v in low.bindings[:n_in]]
    assert {v.name for v in low.bindings[:n_in] if not v.is_constant} <= set(by_name)
    return args + [np.zeros(v.type.shape, v.type.dtype.numpy) for v in low.bindings[n_in:]]


def _feeds(rng):
    return {"ids": rng.integers(-10, 10, 6).astype(np.int64), "ids32": rng.integers(-8, 6, 6).astype(np.int32),
            "coords": np.stack([rng.integers(-3, 3, 6), rng.integers(-5, 5, 6)], 1).astype(np.int64),
            "grid": rng.standard_normal((3, 5, 4)).astype(np.float32),
            "small": rng.standard_normal((2, 4)).astype(np.float32)}


def test_valid_indices_interpret_like_the_reference():
    from tilefuse.reference import run_graph

    graph = _lookup_graph()
    low = lower_group(_one_group(graph), CPU)
    feeds = _feeds(np.random.default_rng())
    args = _args(low, feeds, graph)
    status = np.zeros(2, np.int64)
    run_program(low.program, args, status)
    assert status.tolist() == [0, 0]
    np.testing.assert_allclose(args[-1], run_graph(graph, feeds)["out"], rtol=1e-6)


@pytest.mark.parametrize("name,at,bad,site", [("ids", (4,), 10, 0), ("ids", (0,), -11, 0), ("ids32", (2,), 6, 1),
                                              ("coords", (5, 1), 2**40, 3), ("coords", (1, 0), -2**63, 2)])
def test_an_index_out_of_range_reads_position_0_and_records_its_site(name, at, bad, site):
    graph = _lookup_graph()
    low = lower_group(_one_group(graph), CPU)
    feeds = _feeds(np.random.default_rng())
    feeds[name][at] = bad
    args = _args(low, feeds, graph)
    status = np.zeros(2, np.int64)
    run_program(low.program, args, status)  # no out-of-range load: the interpreter would raise
    assert status.tolist() == [site + 1, bad + 1 if name == "ids32" else bad]  # "pos" checks ids32 + 1
    with pytest.raises(TileInterpreterError, match=f"index check {site} found"):
        run_program(low.program, _args(low, feeds, graph))  # without a status word, the error is the interpreter's


def test_constant_indices_out_of_range_are_refused_when_lowered():
    """The frontend reports a model's constant indices; a graph built by hand gets here."""
    b = Builder("bad", fold=False)
    x = b.input("x", TensorType(F32, (3, 2)))
    b.origin = "g"
    b.output("y", b.map(ScalarFn.NEG, b.emit1(Gather(0), x, b.const(np.array([0, 3], np.int64)))))
    with pytest.raises(GraphError, match=r"constant index 3 is outside \[-3, 3\)"):
        lower_group(_one_group(b.graph), CPU)


def test_the_verifier_refuses_a_check_of_a_site_the_program_does_not_have():
    from tilefuse.tile_ir.ir import Buffer, Loop, LoopKind, Scope

    ids, out = Buffer("ids", I64, (4,), Scope.GLOBAL), Buffer("out", I64, (4,), Scope.GLOBAL)
    i = Var("i")
    body = (Loop(i, 4, LoopKind.PARALLEL, (Store(out, (i,), IndexCheck(Load(ids, (i,)), 5, 1)),)),)
    ok = TileProgram("p", (ids, out), 1, (1,), (Var("bx"),), 1, (), body, index_sites=2)
    verify_program(ok)
    with pytest.raises(GraphError, match="index check"):
        verify_program(TileProgram("p", (ids, out), 1, (1,), (Var("bx"),), 1, (), body, index_sites=1))
