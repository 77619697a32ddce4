"""Reduction, arg-reduction, softmax-family, CumSum and TopK converters against onnxruntime.

Each case is one ONNX node; runtime inputs get fresh random values, operands that
must be compile-time constants (axes, K, the CumSum axis) are initializers.
"""
from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import helper as h

from tilefuse.frontend import import_onnx
from tilefuse.frontend.importer import convert_graph
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType
from tilefuse.reference import run_graph
from tests.frontend.node_cases import Case, C, assert_matches, case_inputs, one_node_model, onnxruntime_outputs

RNG = np.random.default_rng()
F32, F16 = np.float32, np.float16


def rand(*shape: int, dtype: type = F32, positive: bool = False) -> np.ndarray:
    """Random data, never all zeros; integer dtypes get small values."""
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(1, 20, size=shape).astype(dtype)
    x = RNG.standard_normal(shape) + 0.1
    return (np.abs(x) + 0.1 if positive else x).astype(dtype)


def ties(*shape: int) -> np.ndarray:
    """Small integers as floats, so maxima repeat (for select_last_index)."""
    return RNG.integers(0, 3, size=shape).astype(F32)


def specials(rows: int, cols: int) -> np.ndarray:
    """Random rows holding NaN, +inf and -inf (two NaNs in one row, a NaN beside +inf)."""
    x = rand(rows, cols)
    x[0, 3] = np.nan
    x[1, [2, 7]] = [np.nan, np.inf]
    x[2, [1, 5, 8]] = [np.nan, -np.inf, np.nan]
    return x


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def build(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    names, graph_inputs, inits, feeds = case_inputs(case)
    outs = [f"out{i}" for i in range(case.outputs)]
    node = h.make_node(case.op, names, outs, **case.attrs)
    m = one_node_model(case, node, graph_inputs, inits, outs)
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    del m.graph.output[:]
    m.graph.output.extend(inferred.graph.output)
    return m, feeds


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    assert_matches(run_graph(graph, feeds), onnxruntime_outputs(model, feeds))


REDUCE = [
    C("sum_axes_input", "ReduceSum", [rand(2, 3, 4), i64(0, 2)], consts=(1,)),
    C("sum_neg_axes_nokeep", "ReduceSum", [rand(2, 3, 4), i64(-1)], consts=(1,), keepdims=0),
    C("sum_all_keep", "ReduceSum", [rand(2, 3, 4)]),
    C("sum_noop_empty_axes", "ReduceSum", [rand(2, 3)], noop_with_empty_axes=1),
    C("sum_int64", "ReduceSum", [rand(3, 5, dtype=np.int64), i64(1)], consts=(1,)),
    C("sum_v11_attr", "ReduceSum", [rand(2, 3, 4)], opset=11, axes=[1], keepdims=0),
    C("mean_v18", "ReduceMean", [rand(2, 3, 4), i64(1, 2)], consts=(1,), opset=18),
    C("mean_v13_attr", "ReduceMean", [rand(2, 3, 4)], opset=13, axes=[-1]),
    C("mean_f16", "ReduceMean", [rand(4, 64, dtype=F16), i64(1)], consts=(1,), opset=18),
    C("mean_int32", "ReduceMean", [rand(4, 6, dtype=np.int32), i64(1)], consts=(1,), opset=18),
    C("max_v18", "ReduceMax", [rand(3, 4, 5), i64(0, 2)], consts=(1,), opset=18, keepdims=0),
    C("max_int8_v20", "ReduceMax", [rand(3, 4, dtype=np.int8), i64(1)], consts=(1,), opset=20),
    C("min_v13", "ReduceMin", [rand(3, 4, 5)], opset=13, axes=[1]),
    C("prod_v18", "ReduceProd", [rand(3, 4, 2), i64(1)], consts=(1,), opset=18),
    C("l1_v18", "ReduceL1", [rand(3, 4, 5), i64(2)], consts=(1,), opset=18),
    C("l1_noop_is_abs", "ReduceL1", [rand(3, 4)], opset=18, noop_with_empty_axes=1),
    C("l2_v18", "ReduceL2", [rand(3, 4, 5), i64(0, 1)], consts=(1,), opset=18),
    C("l2_f16", "ReduceL2", [rand(8, 32, dtype=F16) * F16(40), i64(1)], consts=(1,), opset=18),
    C("sum_square_v18", "ReduceSumSquare", [rand(3, 4, 5), i64(1)], consts=(1,), opset=18, keepdims=0),
    C("sum_square_noop_squares", "ReduceSumSquare", [rand(3, 4)], opset=18, noop_with_empty_axes=1),
    C("log_sum_v18", "ReduceLogSum", [rand(3, 4, positive=True), i64(1)], consts=(1,), opset=18),
    C("log_sum_exp_v18", "ReduceLogSumExp", [rand(3, 4, 5), i64(2)], consts=(1,), opset=18),
    C("log_sum_exp_large", "ReduceLogSumExp", [rand(3, 6) * F32(300)], opset=13, axes=[1], keepdims=0),
    C("log_sum_exp_f16", "ReduceLogSumExp", [rand(4, 16, dtype=F16) * F16(20), i64(1)], consts=(1,), opset=18),
    pytest.param(C("mean_all_to_scalar", "ReduceMean", [rand(3, 4)], opset=18, keepdims=0)),
]

ARG = [
    C("argmax_axis1", "ArgMax", [rand(3, 4, 5)], axis=1),
    C("argmax_nokeep_neg", "ArgMax", [rand(3, 4, 5)], axis=-1, keepdims=0),
    C("argmax_last_index", "ArgMax", [ties(4, 6)], axis=1, select_last_index=1),
    C("argmin_first_index", "ArgMin", [ties(4, 6)], axis=0),
    C("argmin_last_index_nokeep", "ArgMin", [ties(4, 6)], axis=1, keepdims=0, select_last_index=1),
    C("argmax_int32", "ArgMax", [rand(5, 4, dtype=np.int32)], axis=0),
]

SOFTMAX = [
    C("softmax_default", "Softmax", [rand(2, 3, 8)]),
    C("softmax_axis1", "Softmax", [rand(2, 3, 8)], axis=1),
    C("softmax_large", "Softmax", [rand(3, 8) * F32(1000)], axis=-1),
    C("softmax_f16", "Softmax", [rand(4, 32, dtype=F16) * F16(8)]),
    C("softmax_v11_upgraded", "Softmax", [rand(2, 3, 4)], opset=11, axis=1),
    C("log_softmax_default", "LogSoftmax", [rand(2, 3, 8)]),
    C("log_softmax_axis0_f16", "LogSoftmax", [rand(5, 6, dtype=F16)], axis=0),
    C("log_softmax_large", "LogSoftmax", [rand(3, 8) * F32(500)]),
    C("hardmax_default", "Hardmax", [rand(3, 4, 5)]),
    C("hardmax_axis1_ties", "Hardmax", [ties(3, 4, 5)], axis=1),
    C("hardmax_f16", "Hardmax", [rand(3, 7, dtype=F16)], axis=0),
]

OPAQUE = [
    C("cumsum", "CumSum", [rand(3, 4), i64(1)], consts=(1,)),
    C("cumsum_exclusive_reverse", "CumSum", [rand(3, 4, 5), np.array(-2, np.int64)], consts=(1,), exclusive=1, reverse=1),
    C("cumsum_int32", "CumSum", [rand(6, 2, dtype=np.int32), np.array(0, np.int32)], consts=(1,)),
    C("topk_largest", "TopK", [rand(3, 10), i64(4)], consts=(1,), outputs=2),
    C("topk_smallest_axis0", "TopK", [rand(8, 3), i64(3)], consts=(1,), outputs=2, axis=0, largest=0),
    C("topk_f16", "TopK", [rand(2, 9, dtype=F16), i64(2)], consts=(1,), outputs=2),
    # NaN ranks above +inf, as in onnxruntime and onnx's reference
    C("topk_nan_largest", "TopK", [specials(4, 10), i64(4)], consts=(1,), outputs=2),
    C("topk_nan_smallest", "TopK", [specials(4, 10), i64(9)], consts=(1,), outputs=2, largest=0),
]


@pytest.mark.parametrize("case", REDUCE + ARG + SOFTMAX + OPAQUE, ids=lambda c: c.id if isinstance(c, Case) else c.values[0].id)
def test_against_onnxruntime(case: Case) -> None:
    check(*build(case))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_pre_13_flattening_semantics(op: str) -> None:
    """Opset 11 semantics (coerce to 2-D at ``axis``), converted without the version
    converter: the until=12 converters handle a model that reaches them unconverted."""
    model, feeds = build(C("v11", op, [rand(2, 3, 4)], opset=11, axis=1))
    x = feeds["in0"]
    graph = convert_graph(model, {"in0": TensorType(DType.FLOAT32, x.shape)}, {})
    got = run_graph(graph, feeds)
    assert_matches(got, onnxruntime_outputs(model, feeds))


def test_reduce_mean_is_sum_times_reciprocal() -> None:
    """A mean reaches the partitioner as ReduceSum and a Map MUL by 1/n."""
    model, feeds = build(C("m", "ReduceMean", [rand(4, 5), i64(1)], consts=(1,), opset=18))
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    assert [n.op.name for n in graph.nodes] == ["reduce_sum", "mul"]
    assert graph.nodes[1].inputs[1].data.item() == pytest.approx(0.2)


def test_softmax_is_one_row_reduction_family() -> None:
    model, feeds = build(C("s", "Softmax", [rand(4, 8)]))
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    assert [n.op.name for n in graph.nodes] == ["reduce_max", "sub", "exp", "reduce_sum", "div"]
