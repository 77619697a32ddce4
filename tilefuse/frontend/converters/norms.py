"""Normalizations -> Reduce and Map primitives, in one shared form.

Every normalization over some axes is written the same way (:func:`standardize`)::

    mean    = ReduceSum(x) * (1/n)
    centred = x - mean
    var     = ReduceSum(centred * centred) * (1/n)
    y       = centred / sqrt(var + eps)

so LayerNormalization, InstanceNormalization, GroupNormalization and a model's own
ReduceMean/Sub/Pow/Sqrt/Div chain reach the partitioner as the same primitives. (A
model's ``Pow(d, 2)`` stays a Map POW where this writes ``d * d``: both are Maps, and
the partitioner decides on primitive kinds, not on scalar functions.) Half
floats compute in float32 (cast up, compute, cast down), as ONNX Runtime does.
BatchNormalization in inference mode is a per-channel scale and shift.
"""
from __future__ import annotations

from dataclasses import dataclass

from tilefuse.frontend.context import NodeContext, onnx_dtype
from tilefuse.frontend.converters.reduce import mean_of, normalize_axis, scalar, to_compute
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import ReduceFn
from tilefuse.ir.prims import ScalarFn as F


@dataclass(frozen=True)
class Standardized:
    y: Value  # (x - mean) / sqrt(var + eps)
    mean: Value  # keepdims
    std: Value  # sqrt(var + eps), keepdims


def standardize(b: Builder, x: Value, axes: tuple[int, ...], eps: float) -> Standardized:
    """Zero mean, unit variance over ``axes``; ``x`` already in its compute dtype."""
    mean = mean_of(b, x, axes)
    centred = b.map(F.SUB, x, mean)
    var = mean_of(b, b.map(F.MUL, centred, centred), axes)
    std = b.map(F.SQRT, b.map(F.ADD, var, scalar(b, eps, var)))
    return Standardized(b.map(F.DIV, centred, std), mean, std)


def _stash(ctx: NodeContext) -> DType:
    """``stash_type``: the dtype of LayerNormalization's Mean and InvStdDev outputs."""
    stash = onnx_dtype(ctx.attr("stash_type", 1), f"{ctx.op_type} node {ctx.label!r}: stash_type")
    if not stash.is_float:
        raise ctx.unsupported(f"stash_type={stash}")
    return stash


def _stash_dtype(ctx: NodeContext, x: Value) -> DType:
    """Stage one's precision: ``stash_type``, but never below x's compute dtype."""
    wide = x.type.dtype.compute
    return wide if wide is DType.FLOAT64 else _stash(ctx).compute


def _affine(b: Builder, y: Value, scale: Value | None, bias: Value | None) -> Value:
    """``y * scale + bias`` with the parameters cast to y's dtype."""
    if scale is not None:
        y = b.map(F.MUL, y, b.cast(scale, y.type.dtype))
    if bias is not None:
        y = b.map(F.ADD, y, b.cast(bias, y.type.dtype))
    return y


def _per_channel(b: Builder, p: Value | None, rank: int) -> Value | None:
    """A ``[C]`` parameter viewed as ``[C, 1, ...]`` against ``[N, C, *S]``."""
    return None if p is None else b.reshape(p, (p.type.size,) + (1,) * (rank - 2))


def _trailing_axes(ctx: NodeContext, x: Value, default: int = -1) -> tuple[int, ...]:
    axis = normalize_axis(ctx, ctx.attr("axis", default), x.type.rank)
    return tuple(range(axis, x.type.rank))


@converter("LayerNormalization", since=17)
def layer_normalization(ctx: NodeContext) -> list[Value]:
    """Normalize over the axes from ``axis`` on; outputs Y, Mean and InvStdDev (the
    last two in the stash dtype; unused ones are dropped as dead code)."""
    b, x = ctx.b, ctx.input(0)
    s = standardize(b, b.cast(x, _stash_dtype(ctx, x)), _trailing_axes(ctx, x), ctx.attr("epsilon", 1e-5))
    y = _affine(b, s.y, ctx.input(1), ctx.optional_input(2))
    inv_std = b.map(F.RECIPROCAL, s.std)
    return [b.cast(y, x.type.dtype), b.cast(s.mean, _stash(ctx)), b.cast(inv_std, _stash(ctx))]


@converter("RMSNormalization", since=23)
def rms_normalization(ctx: NodeContext) -> Value:
    """``x / sqrt(mean(x * x) + eps) * scale`` over the axes from ``axis`` on."""
    b, x = ctx.b, ctx.input(0)
    xc = b.cast(x, _stash_dtype(ctx, x))
    axes = _trailing_axes(ctx, x)
    ms = mean_of(b, b.map(F.MUL, xc, xc), axes)
    rms = b.map(F.SQRT, b.map(F.ADD, ms, scalar(b, ctx.attr("epsilon", 1e-5), ms)))
    y = _affine(b, b.map(F.DIV, xc, rms), ctx.input(1), None)
    return b.cast(y, x.type.dtype)


@converter("InstanceNormalization")
def instance_normalization(ctx: NodeContext) -> Value:
    """Per sample and channel over the spatial axes; scale and bias per channel."""
    b, x = ctx.b, ctx.input(0)
    if x.type.rank < 3:
        raise ctx.error(f"input must be [N, C, spatial...], got {x.type}")
    rank = x.type.rank
    s = standardize(b, to_compute(b, x), tuple(range(2, rank)), ctx.attr("epsilon", 1e-5))
    y = _affine(b, s.y, _per_channel(b, ctx.input(1), rank), _per_channel(b, ctx.input(2), rank))
    return b.cast(y, x.type.dtype)


def _group_standardize(ctx: NodeContext, x: Value, stash: DType) -> tuple[Value, int]:
    """x standardized per sample and group, shaped ``[N, G, C/G, *S]``; and G."""
    b = ctx.b
    if x.type.rank < 3:
        raise ctx.error(f"input must be [N, C, spatial...], got {x.type}")
    n, c, *spatial = x.type.shape
    g = ctx.attr("num_groups")
    if not g or c % g:
        raise ctx.error(f"num_groups={g} does not divide the {c} channels")
    grouped = b.reshape(b.cast(x, stash), (n, g, c // g, *spatial))
    s = standardize(b, grouped, tuple(range(2, grouped.type.rank)), ctx.attr("epsilon", 1e-5))
    return s.y, g


@converter("GroupNormalization", since=18, until=20)
def group_normalization_18(ctx: NodeContext) -> Value:
    """Opset 18: scale and bias hold one value per group."""
    b, x = ctx.b, ctx.input(0)
    y, g = _group_standardize(ctx, x, x.type.dtype.compute)
    view = (g,) + (1,) * (y.type.rank - 2)
    y = _affine(b, y, b.reshape(ctx.input(1), view), b.reshape(ctx.input(2), view))
    return b.cast(b.reshape(y, x.type.shape), x.type.dtype)


@converter("GroupNormalization", since=21)
def group_normalization(ctx: NodeContext) -> Value:
    """Opset 21: scale and bias hold one value per channel; stash_type sets stage one's precision."""
    b, x = ctx.b, ctx.input(0)
    y, _ = _group_standardize(ctx, x, _stash_dtype(ctx, x))
    y = b.reshape(y, x.type.shape)
    rank = x.type.rank
    y = _affine(b, y, _per_channel(b, ctx.input(1), rank), _per_channel(b, ctx.input(2), rank))
    return b.cast(y, x.type.dtype)


@converter("BatchNormalization")
def batch_normalization(ctx: NodeContext) -> Value:
    """Inference: ``x * s + t`` with ``s = scale / sqrt(var + eps)``, ``t = B - mean * s``
    per channel (folded to constants when the statistics are weights)."""
    if ctx.attr("training_mode", 0):
        raise ctx.unsupported("training_mode=1")
    if ctx.has_attr("spatial") and not ctx.attr("spatial"):
        raise ctx.unsupported("spatial=0")
    if len([o for o in ctx.node.output[1:] if o]):
        raise ctx.unsupported("running statistics outputs (training)")
    b, x = ctx.b, ctx.input(0)
    if x.type.rank < 2:
        raise ctx.error(f"input must be [N, C, ...], got {x.type}")
    wide = x.type.dtype.compute
    scale, bias, mean, var = (b.cast(ctx.input(i), wide) for i in range(1, 5))
    std = b.map(F.SQRT, b.map(F.ADD, var, scalar(b, ctx.attr("epsilon", 1e-5), var)))
    s = b.map(F.DIV, scale, std)
    t = b.map(F.SUB, bias, b.map(F.MUL, mean, s))
    rank = x.type.rank
    y = _affine(b, b.cast(x, wide), _per_channel(b, s, rank), _per_channel(b, t, rank))
    return b.cast(y, x.type.dtype)


@converter("LpNormalization")
def lp_normalization(ctx: NodeContext) -> Value:
    """``x / ||x||_p`` along ``axis`` (p is 1 or 2); a zero norm gives zeros."""
    b, x = ctx.b, ctx.input(0)
    p = ctx.attr("p", 2)
    if p not in (1, 2):
        raise ctx.unsupported(f"p={p}")
    axis = normalize_axis(ctx, ctx.attr("axis", -1), x.type.rank)
    xc = to_compute(b, x)
    if p == 1:
        norm = b.reduce(ReduceFn.SUM, b.map(F.ABS, xc), (axis,), True)
    else:
        norm = b.map(F.SQRT, b.reduce(ReduceFn.SUM, b.map(F.MUL, xc, xc), (axis,), True))
    zero = scalar(b, 0, norm)
    y = b.map(F.WHERE, b.map(F.EQ, norm, zero), zero, b.map(F.DIV, xc, norm))
    return b.cast(y, x.type.dtype)


@converter("MeanVarianceNormalization")
def mean_variance_normalization(ctx: NodeContext) -> Value:
    """``(x - mean) / (sqrt(var) + 1e-9)`` over ``axes`` (the spec's function body puts
    its epsilon on the standard deviation, not the variance)."""
    b, x = ctx.b, ctx.input(0)
    axes = tuple(sorted({normalize_axis(ctx, a, x.type.rank) for a in ctx.attr("axes", [0, 2, 3])}))
    xc = to_compute(b, x)
    mean = mean_of(b, xc, axes)
    centred = b.map(F.SUB, xc, mean)
    std = b.map(F.SQRT, mean_of(b, b.map(F.MUL, centred, centred), axes))
    y = b.map(F.DIV, centred, b.map(F.ADD, std, scalar(b, 1e-9, std)))
    return b.cast(y, x.type.dtype)
