"""Widening casts move into the kernels that read them (partition/casts.py): the product
writes fp16 and the norm kernel casts on load; graph outputs, narrowing casts and values
a host step reads stay where they are."""
import numpy as np
import pytest

from tilefuse.ir import Builder, DType, TensorType, verify_graph
from tilefuse.ir.dtypes import widens_exactly
from tilefuse.ir.prims import Map, ReduceFn, ScalarFn
from tilefuse.partition import partition_graph
from tilefuse.partition.summary import format_summary, summarize_partition
from tilefuse.target import CPU, CUDA_SM90A

F16, F32 = DType.FLOAT16, DType.FLOAT32


def norm_after_product(*, narrow=F16, wide=F32, cols=4096, wide_output=False, square_output=False):
    """x @ W + b in ``narrow``, cast to ``wide``, a LayerNorm in ``wide``, cast back.
    16 rows of 4096: two kernels on both targets."""
    rng = np.random.default_rng(0)
    b = Builder("norm")
    x = b.input("x", TensorType(narrow, (2, 8, 64)))
    h = b.matmul(x, b.const(rng.standard_normal((64, cols)).astype(narrow.numpy)))
    h = b.map(ScalarFn.ADD, h, b.const(rng.standard_normal(cols).astype(narrow.numpy)))
    v = b.cast(h, wide)
    inv = b.const(np.array(1 / cols, wide.numpy))
    mean = b.map(ScalarFn.MUL, b.reduce(ReduceFn.SUM, v, [2], True), inv)
    d = b.map(ScalarFn.SUB, v, mean)
    var = b.map(ScalarFn.MUL, b.reduce(ReduceFn.SUM, b.map(ScalarFn.MUL, d, d), [2], True), inv)
    y = b.map(ScalarFn.DIV, d, b.map(ScalarFn.SQRT, b.map(ScalarFn.ADD, var, b.const(np.array(1e-5, wide.numpy)))))
    b.output("y", b.cast(y, narrow))
    if wide_output:
        b.output("wide", v)
    if square_output:  # the cast's result is read inside the product's kernel too
        b.output("square", b.cast(b.map(ScalarFn.MUL, v, v), narrow))
    return b.graph


def _casts(group):
    return [n for n in group.nodes if isinstance(n.op, Map) and n.op.fn is ScalarFn.CAST]


def _dtypes(values):
    return [v.type.dtype for v in values if not v.is_constant]


@pytest.mark.parametrize("target", [CPU, CUDA_SM90A], ids=lambda t: t.name)
def test_product_writes_half_and_the_norm_casts_on_load(target):
    graph = norm_after_product()
    p = partition_graph(graph, target)
    verify_graph(graph)
    product, norm = p.groups
    assert _dtypes(product.outputs) == [F16]
    assert _dtypes(norm.inputs) == [F16]
    assert [n.op.to for n in _casts(product)] == []
    assert [n.op.to for n in _casts(norm)] == [F32, F16]
    assert p.recomputed == []  # the original left the graph: one cast, now in the norm's kernel
    assert sum(1 for n in graph.nodes if isinstance(n.op, Map) and n.op.to is F32) == 1
    assert p.refusals and p.refusals[0].node_b == _casts(norm)[0].name


@pytest.mark.parametrize("target", [CPU, CUDA_SM90A], ids=lambda t: t.name)
def test_group_costs_count_the_half_tensor(target):
    before = partition_graph(norm_after_product(), target, move_casts=False)
    after = partition_graph(norm_after_product(), target)
    half = 16 * 4096 * 2  # bytes of the fp16 tensor; fp32 was twice that
    assert before.groups[0].cost.bytes_out - after.groups[0].cost.bytes_out == half
    assert before.groups[1].cost.bytes_in - after.groups[1].cost.bytes_in == half
    assert after.groups[1].cost.flops > before.groups[1].cost.flops  # the cast, now in the norm
    s0, s1 = summarize_partition(before, 11), summarize_partition(after, 11)
    assert s0["fused_bytes"] - s1["fused_bytes"] == 2 * half
    assert (s0["unfused_bytes"], s0["primitives"]) == (s1["unfused_bytes"], s1["primitives"])
    assert s1["fused_estimated_seconds"] < s0["fused_estimated_seconds"]


def test_a_wide_graph_output_keeps_its_dtype_and_its_producer():
    graph = norm_after_product(wide_output=True)
    product, norm = partition_graph(graph, CPU).groups
    assert _dtypes(product.outputs) == [F32]
    assert graph.outputs["wide"].type.dtype is F32
    assert graph.outputs["wide"].producer in product.nodes
    assert _dtypes(norm.inputs) == [F32] and [n.op.to for n in _casts(norm)] == [F16]


def test_narrowing_cast_stays():
    graph = norm_after_product(narrow=F32, wide=F16, cols=4096)
    before = [[n.name for n in g.nodes] for g in partition_graph(norm_after_product(narrow=F32, wide=F16, cols=4096), CPU,
                                                                 move_casts=False).groups]
    p = partition_graph(graph, CPU)
    assert [[n.name for n in g.nodes] for g in p.groups] == before
    assert [n.op.to for n in _casts(p.groups[0])] == [F16]
    assert p.recomputed == []


def test_cast_read_in_its_own_kernel_too_is_recomputed_in_the_reader():
    graph = norm_after_product(square_output=True)
    p = partition_graph(graph, CPU)
    verify_graph(graph)
    product, norm = p.groups
    assert [n.op.to for n in _casts(product)] == [F32, F16]  # the original, read by the square
    assert [n.op.to for n in _casts(norm)] == [F32, F16]  # its copy
    assert _dtypes(product.outputs) == [F16, F16] and _dtypes(norm.inputs) == [F16]
    (copy,) = p.recomputed
    assert copy is _casts(norm)[0] and copy.inputs == _casts(product)[0].inputs
    s = summarize_partition(p, 0)
    assert s["recomputed"] == 1 and s["primitives"] == len(graph.nodes) - 1
    assert "1 primitives recomputed in a second kernel" in format_summary(s)


def test_a_host_step_reader_keeps_the_cast_in_the_producer():
    from tilefuse.ir.prims import TopK

    b = Builder("topk")
    x = b.input("x", TensorType(F16, (4, 64)))
    h = b.matmul(x, b.const(np.ones((64, 64), np.float16)))
    v = b.cast(b.map(ScalarFn.ADD, h, b.const(np.ones(64, np.float16))), F32)
    vals, _ = b.emit(TopK(axis=1, k=4), [v])
    b.output("y", b.map(ScalarFn.ADD, v, b.const(np.float32(1))))
    b.output("top", vals)
    p = partition_graph(b.graph, CPU)
    writer = next(g for g in p.groups if v.producer in g.nodes)
    assert v in writer.outputs and p.recomputed == []


def test_exact_widenings():
    exact = [(F16, F32), (DType.BFLOAT16, F32), (F16, DType.FLOAT64), (F32, DType.FLOAT64), (DType.INT8, DType.INT32),
             (DType.UINT8, DType.INT16), (DType.UINT8, F16), (DType.INT16, F32), (DType.INT32, DType.FLOAT64),
             (DType.BOOL, F16)]
    lossy = [(F32, F16), (F16, DType.BFLOAT16), (DType.BFLOAT16, F16), (DType.INT16, F16), (DType.INT32, F32),
             (DType.INT64, DType.FLOAT64), (DType.UINT8, DType.INT8), (DType.INT8, DType.UINT32), (F16, DType.INT32),
             (DType.INT8, DType.BOOL)]
    assert all(widens_exactly(a, b) for a, b in exact)
    assert not any(widens_exactly(a, b) for a, b in lossy)
    # and by enumeration where it is cheap: every fp16 and every int16 value round-trips
    f16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = np.isfinite(f16)
    assert np.array_equal(f16[finite].astype(np.float32).astype(np.float16), f16[finite])


@pytest.mark.parametrize("target", [CPU, CUDA_SM90A], ids=lambda t: t.name)
@pytest.mark.parametrize("extra", [{}, {"square_output": True}], ids=["norm", "recomputed"])
def test_kernels_with_moved_casts_interpret_like_the_reference(target, extra):
    """The product's kernel writes fp16, the norm's reads it and casts on load: the tile
    programs of both, run by the tile interpreter, agree with the reference executor."""
    from tilefuse.compare import compare_output
    from tilefuse.reference import evaluate_all
    from tilefuse.tile_ir import lower_group, run_program

    graph = norm_after_product(**extra)
    x = np.random.default_rng(3).standard_normal((2, 8, 64)).astype(np.float16)
    p = partition_graph(graph, target)
    values = evaluate_all(graph, {"x": x})  # after the move: the copies' values too
    for group in p.groups:
        lowered = lower_group(group, target)
        n_in = lowered.program.num_inputs
        args = [v.data if v.is_constant else values[id(v)] for v in lowered.bindings[:n_in]]
        outs = [np.zeros(v.type.shape, v.type.dtype.numpy) for v in lowered.bindings[n_in:]]
        run_program(lowered.program, [np.ascontiguousarray(a) for a in args] + outs)
        if group is p.groups[1]:  # the norm's kernel: its activation param is the fp16 sum
            assert [b.dtype for b, v in zip(lowered.program.inputs, lowered.bindings) if not v.is_constant] == [F16]
        for v, got in zip(lowered.bindings[n_in:], outs):
            c = compare_output(v.name, got, values[id(v)])
            assert c.ok, f"{group.name}: {v.name}: {c.problem}"
