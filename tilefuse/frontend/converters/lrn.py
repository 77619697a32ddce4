"""LRN (local response normalization) -> WindowReduce and Map primitives.

``y = x / (bias + alpha / size * square_sum) ** beta``, where ``square_sum`` adds the
squares of ``size`` neighbouring channels. That sum is a window sum whose window spans
``size`` channels and one position of every spatial axis, so it is one WindowReduce
over the trailing ``[C, d1, ..., dk]`` axes with a ``[size, 1, ..., 1]`` kernel and
zero padding on the channel axis only: no transposes, nothing but a reduction the
partitioner already knows.
"""
from __future__ import annotations

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import scalar, to_compute
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import ReduceFn, WindowReduce
from tilefuse.ir.prims import ScalarFn as F


def channel_window_sum(b: Builder, x: Value, size: int) -> Value:
    """For each channel ``c`` of ``x [N, C, ...]``, the sum over the channels
    ``c - floor((size - 1) / 2) .. c + ceil((size - 1) / 2)`` that exist."""
    spatial = x.type.rank - 2
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    ones = (1,) * (spatial + 1)
    zeros = (0,) * spatial
    op = WindowReduce(ReduceFn.SUM, (size,) + ones[1:], ones, ones, (before,) + zeros + (after,) + zeros)
    return b.emit1(op, x)


@converter("LRN")
def lrn(ctx: NodeContext) -> Value:
    """Cross-channel LRN of ``[N, C, d...]`` inputs (any number of spatial axes); half floats compute in float32."""
    b, x = ctx.b, ctx.input(0)
    if x.type.rank < 2:
        raise ctx.error(f"input must be [N, C, d...], got {x.type}")
    size = int(ctx.attr("size"))
    if size < 1:
        raise ctx.error(f"size must be positive, got {size}")
    alpha, beta, bias = ctx.attr("alpha", 0.0001), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    xc = to_compute(b, x)
    square_sum = channel_window_sum(b, b.map(F.MUL, xc, xc), size)
    base = b.map(F.ADD, scalar(b, bias, xc), b.map(F.MUL, square_sum, scalar(b, alpha / size, xc)))
    y = b.map(F.DIV, xc, b.map(F.POW, base, scalar(b, beta, xc)))
    return b.cast(y, x.type.dtype)
