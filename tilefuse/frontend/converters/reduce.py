"""Reductions -> Reduce primitives plus Maps (ArgMax / ArgMin too); CumSum and TopK -> Opaque.

Composite reductions are written with the few forms the partitioner sees everywhere
else: a mean is ``ReduceSum * (1/n)``, an L2 norm ``sqrt(ReduceSum(x * x))``, a
log-sum-exp ``log(ReduceSum(exp(x - max))) + max``. LayerNormalization and its
hand-expanded form (ReduceMean, Sub, Pow, Sqrt, Div) therefore give the same primitives.
Half-float composites compute in float32 (cast up, compute, cast down), as ONNX
Runtime does, so a sum of squares cannot overflow float16 on the way.

Softmax, LogSoftmax and Hardmax live in :mod:`softmax` (imported below to register).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import CumSum, ReduceFn, TopK
from tilefuse.ir.prims import ScalarFn as F


# -- helpers shared with the norm, pooling and attention converters -------------------
def scalar(b: Builder, value: float, like: Value) -> Value:
    """A 0-d constant of ``like``'s dtype."""
    return b.scalar_like(value, like)


def to_compute(b: Builder, x: Value) -> Value:
    """``x`` in the dtype its arithmetic is carried out in (float32 for half floats)."""
    return b.cast(x, x.type.dtype.compute)


def reduced_count(x: Value, axes: Sequence[int]) -> int:
    """How many elements of ``x`` each reduction over ``axes`` combines."""
    return math.prod(x.type.shape[a] for a in {a % max(x.type.rank, 1) for a in axes})


def scale_by_count(b: Builder, total: Value, n: int) -> Value:
    """``total / n``: a multiply by the constant ``1/n`` for floats (the form every mean
    takes, so means from any source look alike); integer division for integers."""
    if n == 1:
        return total
    if not total.type.dtype.is_float:
        return b.map(F.DIV, total, scalar(b, max(n, 1), total))
    inv = 1.0 / n if n else float("nan")
    return b.map(F.MUL, total, scalar(b, inv, total))


def mean_of(b: Builder, x: Value, axes: Sequence[int], keepdims: bool = True) -> Value:
    """The mean over ``axes`` as ``ReduceSum(x) * (1/n)``; ``x`` already in its compute dtype."""
    return scale_by_count(b, b.reduce(ReduceFn.SUM, x, axes, keepdims), reduced_count(x, axes))


def non_finite_to_zero(b: Builder, m: Value) -> Value:
    """Replace +-inf by 0: a shift that keeps ``exp(x - m)`` finite and NaN-free."""
    return b.map(F.WHERE, b.map(F.ISINF, m), scalar(b, 0, m), m)


def log_sum_exp(b: Builder, x: Value, axes: Sequence[int], keepdims: bool) -> Value:
    """``log(sum(exp(x)))`` over ``axes``, max-subtracted so large inputs do not overflow."""
    m = non_finite_to_zero(b, b.reduce(ReduceFn.MAX, x, axes, True))
    s = b.reduce(ReduceFn.SUM, b.map(F.EXP, b.map(F.SUB, x, m)), axes, keepdims)
    if not keepdims:
        m = b.reshape(m, s.type.shape)
    return b.map(F.ADD, b.map(F.LOG, s), m)


def normalize_axis(ctx: NodeContext, axis: int, rank: int) -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise ctx.error(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


# -- Reduce* ---------------------------------------------------------------------------
def reduce_axes(ctx: NodeContext, x: Value) -> tuple[int, ...]:
    """The axes to reduce: the ``axes`` attribute (before opset 13/18) or input 1.

    No axes means all of them, unless ``noop_with_empty_axes`` is set: then none, and
    the reduction's elementwise parts still apply (ONNX Runtime and the reference agree:
    ReduceSumSquare then squares, ReduceL1 takes the absolute value).
    """
    axes = ctx.attr("axes")
    if axes is None and ctx.optional_input(1) is not None:
        axes = ctx.const_input(1).reshape(-1).tolist()
    if not axes:
        return () if ctx.attr("noop_with_empty_axes", 0) else tuple(range(x.type.rank))
    rank = x.type.rank
    return tuple(sorted({normalize_axis(ctx, int(a), rank) for a in axes}))


Reducer = Callable[[Builder, Value, tuple[int, ...], bool], Value]


def _plain(fn: ReduceFn) -> Reducer:
    return lambda b, x, axes, keep: b.reduce(fn, x, axes, keep)


def _mean(b: Builder, x: Value, axes: tuple[int, ...], keep: bool) -> Value:
    return mean_of(b, x, axes, keep)


def _l1(b: Builder, x: Value, axes: tuple[int, ...], keep: bool) -> Value:
    return b.reduce(ReduceFn.SUM, b.map(F.ABS, x), axes, keep)


def _sum_square(b: Builder, x: Value, axes: tuple[int, ...], keep: bool) -> Value:
    return b.reduce(ReduceFn.SUM, b.map(F.MUL, x, x), axes, keep)


def _l2(b: Builder, x: Value, axes: tuple[int, ...], keep: bool) -> Value:
    total = _sum_square(b, x, axes, keep)
    if total.type.dtype.is_float:
        return b.map(F.SQRT, total)
    # Integer L2 norms: the square root of the exact integer sum, truncated.
    return b.cast(b.map(F.SQRT, b.cast(total, DType.FLOAT64)), total.type.dtype)


def _log_sum(b: Builder, x: Value, axes: tuple[int, ...], keep: bool) -> Value:
    return b.map(F.LOG, b.reduce(ReduceFn.SUM, x, axes, keep))


# op -> (how to reduce, whether it computes in float32 for half inputs, floats only)
_REDUCERS: dict[str, tuple[Reducer, bool, bool]] = {
    "ReduceSum": (_plain(ReduceFn.SUM), False, False),
    "ReduceProd": (_plain(ReduceFn.PROD), False, False),
    "ReduceMax": (_plain(ReduceFn.MAX), False, False),
    "ReduceMin": (_plain(ReduceFn.MIN), False, False),
    "ReduceMean": (_mean, True, False),
    "ReduceL1": (_l1, True, False),
    "ReduceL2": (_l2, True, False),
    "ReduceSumSquare": (_sum_square, True, False),
    "ReduceLogSum": (_log_sum, True, True),
    "ReduceLogSumExp": (log_sum_exp, True, True),
}


def _register_reduce(op: str, how: Reducer, widen: bool, floats_only: bool) -> None:
    @converter(op)
    def convert(ctx: NodeContext) -> Value:
        b, x = ctx.b, ctx.input(0)
        if floats_only and not x.type.dtype.is_float:
            raise ctx.unsupported(f"{x.type.dtype} input (only defined through exp/log of floats)")
        axes = reduce_axes(ctx, x)
        keepdims = bool(ctx.attr("keepdims", 1))
        y = how(b, to_compute(b, x) if widen else x, axes, keepdims)
        return b.cast(y, x.type.dtype)

    convert.__doc__ = f"ONNX {op}, every opset: axes as attribute or input, keepdims, noop_with_empty_axes."


for _op, (_how, _widen, _floats) in _REDUCERS.items():
    _register_reduce(_op, _how, _widen, _floats)


# -- ArgMax / ArgMin --------------------------------------------------------------------
def arg_reduce_of(b: Builder, fn: ReduceFn, x: Value, axis: int, keepdims: bool, last: bool = False) -> Value:
    """The int64 position of the first (``last``: the last) maximum or minimum of ``x``
    along ``axis``, as two reductions every row and window schedule runs: the extreme
    itself, then the least (greatest) position holding it, each position an int32 iota
    where it does and a sentinel past the ends where it does not. A row where nothing
    equals its extreme (every element NaN) answers 0, as a first-element scan does."""
    n = x.type.shape[axis]
    extreme = b.reduce(fn, x, (axis,), True)
    hit = b.map(F.EQ, x, extreme)
    iota = b.const(np.arange(n, dtype=np.int32).reshape([n if i == axis else 1 for i in range(x.type.rank)]))
    miss = -1 if last else n
    where = b.map(F.WHERE, hit, iota, b.const(np.int32(miss)))
    pos = b.reduce(ReduceFn.MAX if last else ReduceFn.MIN, where, (axis,), True)
    pos = b.map(F.WHERE, b.map(F.EQ, pos, b.const(np.int32(miss))), b.const(np.int32(n - 1 if last else 0)), pos)
    pos = b.cast(pos, DType.INT64)
    return pos if keepdims else b.reshape(pos, [d for i, d in enumerate(x.type.shape) if i != axis])


def _register_arg(op: str, fn: ReduceFn) -> None:
    @converter(op)
    def convert(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        axis = normalize_axis(ctx, ctx.attr("axis", 0), x.type.rank)
        keepdims = bool(ctx.attr("keepdims", 1))
        last = bool(ctx.attr("select_last_index", 0))
        return arg_reduce_of(ctx.b, fn, x, axis, keepdims, last)


_register_arg("ArgMax", ReduceFn.MAX)
_register_arg("ArgMin", ReduceFn.MIN)


# -- CumSum, TopK (Opaque) ----------------------------------------------------------------
def running(ctx: NodeContext, scan: type) -> Value:
    """A running reduction (CumSum, CumProd) along a compile-time ``axis`` input, with its
    exclusive and reverse variants."""
    x = ctx.input(0)
    axis_arr = ctx.const_input(1).reshape(-1)
    if axis_arr.size != 1:
        raise ctx.error(f"axis must hold one value, got {axis_arr.tolist()}")
    axis = normalize_axis(ctx, int(axis_arr[0]), x.type.rank)
    return ctx.b.emit1(scan(axis, bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0))), x)


@converter("CumSum", since=11)
def cumsum(ctx: NodeContext) -> Value:
    return running(ctx, CumSum)


@converter("TopK")
def top_k(ctx: NodeContext) -> list[Value]:
    """The k largest or smallest along ``axis``; k is an attribute (opset < 10) or a
    compile-time input. With ``sorted=0`` any order is allowed; the output is sorted."""
    x = ctx.input(0)
    if ctx.optional_input(1) is not None:
        k_arr = ctx.const_input(1).reshape(-1)
        if k_arr.size != 1:
            raise ctx.error(f"K must hold one value, got {k_arr.tolist()}")
        k = int(k_arr[0])
    else:
        k = int(ctx.attr("k"))
    axis = normalize_axis(ctx, ctx.attr("axis", -1), x.type.rank)
    if not 0 <= k <= x.type.shape[axis]:
        raise ctx.error(f"K={k} out of range for axis {axis} of {x.type}")
    op = TopK(axis, k, bool(ctx.attr("largest", 1)), bool(ctx.attr("sorted", 1)))
    values, indices = ctx.b.emit(op, [x])
    return [values, indices]


# Registered here so that importing this module registers the whole family.
from tilefuse.frontend.converters import softmax  # noqa: E402,F401
