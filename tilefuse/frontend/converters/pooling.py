"""Pooling -> WindowReduce (local) or Reduce (global), with Maps around them.

An average is a window sum times a constant reciprocal count. The count depends only
on the geometry, so it is computed here with numpy (by running the same window sum
over ones) and becomes a constant the Map multiplies by. Lp pooling is
``(window_sum(|x| ** p)) ** (1/p)``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import arg_reduce_of, mean_of, scalar, to_compute
from tilefuse.frontend.converters.spatial import Window, ceil_extra, span, window, with_end_padding
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Gather, Pad, ReduceFn, WindowReduce
from tilefuse.ir.prims import ScalarFn as F


def _geometry(ctx: NodeContext, x: Value) -> tuple[tuple[int, ...], Window, Window]:
    """(kernel, window as the node states it, window with ceil-mode end padding)."""
    if x.type.rank < 3:
        raise ctx.error(f"input must be [N, C, spatial...], got {x.type}")
    kernel = tuple(int(k) for k in ctx.attr("kernel_shape") or ())
    if len(kernel) != x.type.rank - 2:
        raise ctx.error(f"kernel_shape {list(kernel)} does not match input {x.type}")
    sizes = x.type.shape[2:]
    geo = window(ctx, sizes, kernel)
    full = with_end_padding(geo, ceil_extra(sizes, kernel, geo)) if ctx.attr("ceil_mode", 0) else geo
    return kernel, geo, full


def _window_reduce(b: Builder, fn: ReduceFn, x: Value, kernel: Sequence[int], w: Window) -> Value:
    return b.emit1(WindowReduce(fn, tuple(kernel), w.strides, w.dilations, w.pads), x)


# -- MaxPool ------------------------------------------------------------------------------
@converter("MaxPool")
def max_pool(ctx: NodeContext) -> list[Value]:
    """Max over windows (padding never wins); the optional Indices output is computed by
    gathering each window, the position of its maximum, and a constant table of flat input indices."""
    b, x = ctx.b, ctx.input(0)
    kernel, _, full = _geometry(ctx, x)
    y = _window_reduce(b, ReduceFn.MAX, x, kernel, full)
    if len(ctx.node.output) < 2 or not ctx.node.output[1]:
        return [y]
    storage_order = ctx.attr("storage_order", 0)
    if storage_order not in (0, 1):
        raise ctx.unsupported(f"storage_order={storage_order}")
    return [y, _max_indices(b, x, kernel, full, column_major=storage_order == 1)]


def _max_indices(b: Builder, x: Value, kernel: Sequence[int], w: Window, column_major: bool) -> Value:
    """Flat input index of each window's first maximum, as ONNX Runtime numbers them:
    ``(n * C + c) * prod(S)`` plus the spatial offset in row- or column-major order."""
    n, c, *sizes = x.type.shape
    k = len(sizes)
    padded = [sizes[i] + w.pads[i] + w.pads[i + k] for i in range(k)]
    outs = [max(0, (padded[i] - span(kernel[i], w.dilations[i])) // w.strides[i] + 1) for i in range(k)]
    # coords[i][pos, tap]: padded coordinate on dim i of each window position and tap
    pos = np.indices(outs).reshape(k, -1)
    tap = np.indices(kernel).reshape(k, -1)
    coords = [pos[i][:, None] * w.strides[i] + tap[i][None, :] * w.dilations[i] for i in range(k)]
    padded_flat = np.ravel_multi_index(coords, padded)
    inside = [np.clip(coords[i] - w.pads[i], 0, sizes[i] - 1) for i in range(k)]
    source = np.ravel_multi_index(inside, sizes, order="F" if column_major else "C")
    taps = padded_flat.shape[1]

    fill = -np.inf if x.type.dtype.is_float else np.iinfo(x.type.dtype.numpy).min
    xp = b.emit1(Pad((0, 0) + w.pads[:k] + (0, 0) + w.pads[k:], value=fill), x) if any(w.pads) else x
    flat = b.reshape(xp, (n, c, math.prod(padded)))
    windows = b.emit1(Gather(2), flat, b.const(padded_flat.astype(np.int64)))  # [N, C, P, T]
    best = arg_reduce_of(b, ReduceFn.MAX, windows, 3, keepdims=False)  # [N, C, P]
    row = b.const((np.arange(padded_flat.shape[0], dtype=np.int64) * taps))
    spatial = b.emit1(Gather(0), b.const(source.reshape(-1).astype(np.int64)), b.map(F.ADD, best, row))
    channel = np.arange(n * c, dtype=np.int64).reshape(n, c, 1) * math.prod(sizes)
    return b.reshape(b.map(F.ADD, spatial, b.const(channel)), (n, c, *outs))


# -- AveragePool, LpPool ----------------------------------------------------------------------
def _counts(sizes: Sequence[int], kernel: Sequence[int], geo: Window, full: Window, include_pad: bool) -> np.ndarray:
    """How many positions each window averages: the real input positions, plus the
    explicit padding when ``count_include_pad`` (never ceil mode's extra positions)."""
    k = len(sizes)
    ones = np.ones(sizes, dtype=np.float64)
    if include_pad:
        ones = np.pad(ones, [(geo.pads[i], geo.pads[i + k]) for i in range(k)], constant_values=1.0)
        extra = [full.pads[i + k] - geo.pads[i + k] for i in range(k)]
        pads = (0,) * k + tuple(extra)
    else:
        pads = full.pads
    op = WindowReduce(ReduceFn.SUM, tuple(kernel), full.strides, full.dilations, pads)
    (count,) = op.evaluate([ones])
    return count


@converter("AveragePool")
def average_pool(ctx: NodeContext) -> Value:
    """Window sum times the constant reciprocal of each window's count."""
    b, x = ctx.b, ctx.input(0)
    kernel, geo, full = _geometry(ctx, x)
    xc = to_compute(b, x)
    total = _window_reduce(b, ReduceFn.SUM, xc, kernel, full)
    counts = _counts(x.type.shape[2:], kernel, geo, full, bool(ctx.attr("count_include_pad", 0)))
    with np.errstate(divide="ignore"):
        inv = (1.0 / counts).astype(xc.type.dtype.numpy)
    return b.cast(b.map(F.MUL, total, b.const(inv)), x.type.dtype)


def abs_pow(b: Builder, x: Value, p: float) -> Value:
    """``|x| ** p``; p = 1 and p = 2 without a pow."""
    if p == 2:
        return b.map(F.MUL, x, x)
    ax = b.map(F.ABS, x)
    return ax if p == 1 else b.map(F.POW, ax, scalar(b, p, x))


def root(b: Builder, s: Value, p: float) -> Value:
    """``s ** (1/p)``; p = 1 and p = 2 without a pow."""
    if p == 1:
        return s
    if p == 2:
        return b.map(F.SQRT, s)
    return b.map(F.POW, s, scalar(b, 1.0 / p, s))


def _p(ctx: NodeContext) -> float:
    p = ctx.attr("p", 2)
    if p <= 0:
        raise ctx.error(f"p must be positive, got {p}")
    return float(p)


@converter("LpPool")
def lp_pool(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    kernel, _, full = _geometry(ctx, x)
    p = _p(ctx)
    xc = to_compute(b, x)
    total = _window_reduce(b, ReduceFn.SUM, abs_pow(b, xc, p), kernel, full)
    return b.cast(root(b, total, p), x.type.dtype)


# -- global pooling ---------------------------------------------------------------------------
def _spatial_axes(ctx: NodeContext, x: Value) -> tuple[int, ...]:
    if x.type.rank < 3:
        raise ctx.error(f"input must be [N, C, spatial...], got {x.type}")
    return tuple(range(2, x.type.rank))


@converter("GlobalAveragePool")
def global_average_pool(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    return b.cast(mean_of(b, to_compute(b, x), _spatial_axes(ctx, x)), x.type.dtype)


@converter("GlobalMaxPool")
def global_max_pool(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.b.reduce(ReduceFn.MAX, x, _spatial_axes(ctx, x), True)


@converter("GlobalLpPool")
def global_lp_pool(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    p = _p(ctx)
    total = b.reduce(ReduceFn.SUM, abs_pow(b, to_compute(b, x), p), _spatial_axes(ctx, x), True)
    return b.cast(root(b, total, p), x.type.dtype)
