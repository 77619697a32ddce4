"""A merge that only the staged schedule could run is costed at that schedule's real
parallelism: on a GPU one block of ``StagedPolicy.threads``, whose loads wait one after
another, so the partitioner keeps the kernels apart and says why. On a CPU the staged nests
run on the whole thread pool but its products one tile at a time on one core: a product
at a detector's size stays apart from a Concat after it, a tiny one (a launch saved)
still merges."""
import numpy as np

from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.partition import partition_graph
from tilefuse.patterns import StagedMatch, pattern_name
from tilefuse.target import CPU, CUDA_SM90A

F32 = DType.FLOAT32


def _product_then_concat(rows: int = 256):
    """A product whose activation is concatenated with another input (a U-Net skip, a
    YOLO C2f block): no product pattern takes a Concat after its anchor."""
    rng = np.random.default_rng(0)
    b = Builder("skip")
    x = b.input("x", TensorType(F32, (rows, 32)))
    skip = b.input("skip", TensorType(F32, (rows, 16)))
    h = b.matmul(x, b.const(rng.standard_normal((32, 48)).astype(np.float32)))
    h = b.map(ScalarFn.MAX, h, b.const(np.float32(0)))
    b.output("y", b.concat([h, skip], axis=1))
    return b.graph


def _softmax_over_axis(axis: int):
    """A softmax over a middle axis (opset-13 Softmax(axis=1) on [2, 50, 30])."""
    b = Builder("softmax")
    x = b.input("x", TensorType(F32, (2, 50, 30)))
    m = b.reduce(ReduceFn.MAX, x, [axis], keepdims=True)
    e = b.map(ScalarFn.EXP, b.map(ScalarFn.SUB, x, m))
    s = b.reduce(ReduceFn.SUM, e, [axis], keepdims=True)
    b.output("y", b.map(ScalarFn.DIV, e, s))
    return b.graph


def _staged(partition):
    return [g.name for g in partition.groups if isinstance(g.match, StagedMatch)]


def test_a_product_and_a_concat_stay_apart_on_the_gpu_and_say_why():
    p = partition_graph(_product_then_concat(), CUDA_SM90A)
    assert _staged(p) == []
    assert [pattern_name(g.match) for g in p.groups] == ["gemm", "rows"]
    reasons = [r.reason for r in p.refusals]
    assert any("only the staged schedule runs the merged group (one block of 1 thread on cuda:sm_90a)" in r
               for r in reasons), reasons


def test_the_cpu_still_merges_a_tiny_product_and_its_concat():
    """(a launch saved outweighs one core for a 256 x 32 x 48 product)"""
    p = partition_graph(_product_then_concat(), CPU)
    assert len(p.groups) == 1 and _staged(p) == [p.groups[0].name]


def test_the_cpu_keeps_a_large_product_apart_from_a_concat_and_says_why():
    p = partition_graph(_product_then_concat(rows=160 * 160), CPU)
    assert _staged(p) == [] and [pattern_name(g.match) for g in p.groups][0] == "gemm", [g.match for g in p.groups]
    reasons = [r.reason for r in p.refusals]
    assert any("its products one tile at a time on one of" in r for r in reasons), reasons


def test_a_softmax_over_a_middle_axis_is_no_staged_kernel_on_the_gpu():
    p = partition_graph(_softmax_over_axis(1), CUDA_SM90A)
    assert _staged(p) == [], [(g.name, g.match) for g in p.groups]
    assert len(p.groups) > 1
    # over the last axis it is one row kernel, as before
    p = partition_graph(_softmax_over_axis(2), CUDA_SM90A)
    assert [pattern_name(g.match) for g in p.groups] == ["rows"]
