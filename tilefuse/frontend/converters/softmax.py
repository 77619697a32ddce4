"""Softmax, LogSoftmax and Hardmax -> Reduce and Map primitives.

``softmax = exp(x - max) / sum(exp(x - max))``: two reductions over the same axes and
a few Maps, which the partitioner fuses into one row-wise kernel. Half floats compute
in float32. Before opset 13 these ops flattened the input to 2-D at ``axis``; that is
the same as reducing over every axis from ``axis`` on, so no reshape is needed.
(The onnx version converter already rewrites old Softmax/LogSoftmax; it keeps old
Hardmax nodes unchanged, so the opset-13 Hardmax converter would read their axis
with the new meaning. The ``until=12`` converters below serve unconverted models.)
"""
from __future__ import annotations

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import arg_reduce_of, normalize_axis, scalar, to_compute
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import ReduceFn
from tilefuse.ir.prims import ScalarFn as F


def _shifted(b: Builder, x: Value, axes: tuple[int, ...]) -> Value:
    """``x - max(x)`` over ``axes`` (keepdims), the stable argument of ``exp``."""
    return b.map(F.SUB, x, b.reduce(ReduceFn.MAX, x, axes, True))


def softmax_of(b: Builder, x: Value, axes: tuple[int, ...]) -> Value:
    """Softmax over ``axes``, computed in ``x``'s dtype."""
    e = b.map(F.EXP, _shifted(b, x, axes))
    return b.map(F.DIV, e, b.reduce(ReduceFn.SUM, e, axes, True))


def log_softmax_of(b: Builder, x: Value, axes: tuple[int, ...]) -> Value:
    """``(x - max) - log(sum(exp(x - max)))`` over ``axes``."""
    s = _shifted(b, x, axes)
    total = b.reduce(ReduceFn.SUM, b.map(F.EXP, s), axes, True)
    return b.map(F.SUB, s, b.map(F.LOG, total))


def _axes(ctx: NodeContext, x: Value, default: int, flatten: bool) -> tuple[int, ...]:
    axis = normalize_axis(ctx, ctx.attr("axis", default), x.type.rank)
    return tuple(range(axis, x.type.rank)) if flatten else (axis,)


def _widened(ctx: NodeContext, fn, default_axis: int, flatten: bool) -> Value:
    b, x = ctx.b, ctx.input(0)
    if x.type.rank == 0:
        raise ctx.error("input must have rank >= 1")
    y = fn(b, to_compute(b, x), _axes(ctx, x, default_axis, flatten))
    return b.cast(y, x.type.dtype)


@converter("Softmax", since=13)
def softmax(ctx: NodeContext) -> Value:
    return _widened(ctx, softmax_of, -1, flatten=False)


@converter("Softmax", until=12)
def softmax_2d(ctx: NodeContext) -> Value:
    """Opset < 13: softmax over the input flattened to 2-D at ``axis``."""
    return _widened(ctx, softmax_of, 1, flatten=True)


@converter("LogSoftmax", since=13)
def log_softmax(ctx: NodeContext) -> Value:
    return _widened(ctx, log_softmax_of, -1, flatten=False)


@converter("LogSoftmax", until=12)
def log_softmax_2d(ctx: NodeContext) -> Value:
    """Opset < 13: log-softmax over the input flattened to 2-D at ``axis``."""
    return _widened(ctx, log_softmax_of, 1, flatten=True)


def hardmax_of(b: Builder, x: Value, axis: int) -> Value:
    """One-hot of the first maximum along ``axis``: its position, then compare with an iota."""
    idx = arg_reduce_of(b, ReduceFn.MAX, x, axis, keepdims=True)
    n = x.type.shape[axis]
    iota = np.arange(n, dtype=np.int64).reshape([n if i == axis else 1 for i in range(x.type.rank)])
    hot = b.map(F.EQ, idx, b.const(iota))
    return b.map(F.WHERE, hot, scalar(b, 1, x), scalar(b, 0, x))


@converter("Hardmax", since=13)
def hardmax(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    if x.type.rank == 0:
        raise ctx.error("input must have rank >= 1")
    return hardmax_of(ctx.b, x, normalize_axis(ctx, ctx.attr("axis", -1), x.type.rank))


@converter("Hardmax", until=12)
def hardmax_2d(ctx: NodeContext) -> Value:
    """Opset < 13: hardmax of the input flattened to ``[outer, inner]`` at ``axis``."""
    b, x = ctx.b, ctx.input(0)
    shape = x.type.shape
    axis = normalize_axis(ctx, ctx.attr("axis", 1), x.type.rank)
    outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))
    flat = hardmax_of(b, b.reshape(x, (outer, inner)), 1)
    return b.reshape(flat, shape)
