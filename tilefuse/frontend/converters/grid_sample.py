"""GridSample -> Map, GatherND and Reduce primitives, for a grid known only at run time.

Per spatial axis, Maps turn the normalized grid coordinate into a pixel coordinate and
derive the tap positions around it with their weights (1 tap for nearest, 2 for
linear, 4 for cubic). The padding rule applies to each tap, as onnxruntime applies it:
zero padding flags the taps outside the image, border clamps them, reflection folds
them back into range. (The spec's reference also pads the coordinate itself first;
that gives the same values except for cubic taps with border padding, where
onnxruntime's rule is followed.) The
axes' taps combine into one index tensor ``[N, *out, taps..., D]`` that a single
GatherND (batch_dims=1) reads from the channels-last image, and a weighted sum over
the tap axes gives the result. Coordinates compute in float32, as the spec's
reference does; half-float images interpolate in float32.
"""
from __future__ import annotations

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import to_compute
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import GatherND, ReduceFn
from tilefuse.ir.prims import ScalarFn as F

MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic", "nearest": "nearest"}
PADDINGS = ("zeros", "border", "reflection")
TAP_OFFSETS = {"nearest": (0.0,), "linear": (0.0, 1.0), "cubic": (-1.0, 0.0, 1.0, 2.0)}
CUBIC_A = -0.75  # Keys' cubic convolution coefficient, as onnxruntime and PyTorch use


def _c(b: Builder, value: float) -> Value:
    return b.const(np.float32(value))


def _trunc(b: Builder, x: Value) -> Value:
    """Round toward zero (what a float-to-int conversion does)."""
    return b.map(F.WHERE, b.map(F.LT, x, _c(b, 0)), b.map(F.CEIL, x), b.map(F.FLOOR, x))


def _clamp(b: Builder, x: Value, lo: float, hi: float) -> Value:
    return b.map(F.MIN, b.map(F.MAX, x, _c(b, lo)), _c(b, hi))


def reflect(b: Builder, x: Value, lo: float, hi: float) -> Value:
    """Fold ``x`` into ``[lo, hi]`` by reflecting at the borders as often as needed."""
    if hi <= lo:  # a one-pixel axis with align_corners: everything folds onto it
        return b.broadcast(_c(b, lo), x.type.shape)
    below, above = b.map(F.LT, x, _c(b, lo)), b.map(F.GT, x, _c(b, hi))
    distance = b.map(F.WHERE, below, b.map(F.SUB, _c(b, lo), x), b.map(F.SUB, x, _c(b, hi)))
    rng = hi - lo
    turns = b.map(F.FLOOR, b.map(F.MUL, distance, _c(b, 1.0 / rng)))
    rest = b.map(F.SUB, distance, b.map(F.MUL, turns, _c(b, rng)))
    odd = b.map(F.EQ, b.map(F.MOD, turns, _c(b, 2.0)), _c(b, 1.0))
    # Below lo an even number of turns ends measured from lo, an odd one from hi;
    # above hi the other way round.
    from_lo = b.map(F.XOR, below, odd)
    folded = b.map(F.WHERE, from_lo, b.map(F.ADD, _c(b, lo), rest), b.map(F.SUB, _c(b, hi), rest))
    return b.map(F.WHERE, b.map(F.OR, below, above), folded, x)


def _bounds(size: int, align_corners: bool) -> tuple[float, float]:
    """The range of pixel coordinates that sample inside an axis of ``size``."""
    return (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)


def _pixel_coordinate(b: Builder, g: Value, size: int, align_corners: bool, mode: str) -> Value:
    """The pixel coordinate of normalized ``g`` along an axis of ``size``."""
    if align_corners:
        x = b.map(F.MUL, b.map(F.ADD, g, _c(b, 1.0)), _c(b, (size - 1) / 2.0))
    else:
        scaled = b.map(F.MUL, b.map(F.ADD, g, _c(b, 1.0)), _c(b, size))
        x = b.map(F.MUL, b.map(F.SUB, scaled, _c(b, 1.0)), _c(b, 0.5))
    return b.map(F.ROUND, x) if mode == "nearest" else x


def _tap_weights(b: Builder, frac: Value, mode: str) -> Value:
    """Weights ``[..., taps]`` of the taps at ``TAP_OFFSETS[mode]`` from ``floor(x)``,
    ``frac = x - floor(x)`` given as ``[..., 1]``."""
    offsets = b.const(np.array(TAP_OFFSETS[mode], np.float32).astype(frac.type.dtype.numpy))
    s = b.map(F.ABS, b.map(F.SUB, frac, offsets))
    one = b.scalar_like(1.0, s)
    if mode == "linear":
        return b.map(F.SUB, one, s)
    a = CUBIC_A
    s2 = b.map(F.MUL, s, s)
    s3 = b.map(F.MUL, s2, s)
    # Keys' kernel: (a+2)s^3 - (a+3)s^2 + 1 for s <= 1, a s^3 - 5a s^2 + 8a s - 4a beyond.
    near = b.map(F.SUB, b.map(F.MUL, s3, b.scalar_like(a + 2, s)), b.map(F.MUL, s2, b.scalar_like(a + 3, s)))
    near = b.map(F.ADD, near, one)
    far = b.map(F.MUL, s3, b.scalar_like(a, s))
    far = b.map(F.SUB, far, b.map(F.MUL, s2, b.scalar_like(5 * a, s)))
    far = b.map(F.ADD, far, b.map(F.MUL, s, b.scalar_like(8 * a, s)))
    far = b.map(F.SUB, far, b.scalar_like(4 * a, s))
    return b.map(F.WHERE, b.map(F.LE, s, one), near, far)


def _axis_taps(
    b: Builder, x: Value, size: int, align_corners: bool, mode: str, padding: str, weight_dtype: DType
) -> tuple[Value, Value | None, Value | None]:
    """Tap indices (int64), weights and in-image flags (zero padding only), each
    ``[N, *out, taps]``, along one axis for pixel coordinates ``x [N, *out, 1]``."""
    if mode == "nearest":
        taps, weights = _trunc(b, x), None
    else:
        base = b.map(F.FLOOR, x)
        taps = b.map(F.ADD, base, b.const(np.array(TAP_OFFSETS[mode], np.float32)))
        weights = _tap_weights(b, b.cast(b.map(F.SUB, x, base), weight_dtype), mode)
    inside = None
    if padding == "zeros":
        inside = b.map(F.AND, b.map(F.GE, taps, _c(b, 0)), b.map(F.LE, taps, _c(b, size - 1)))
    elif padding == "reflection":
        taps = _trunc(b, reflect(b, taps, *_bounds(size, align_corners)))
    return b.cast(_clamp(b, taps, 0.0, size - 1.0), DType.INT64), weights, inside


def _spread(b: Builder, v: Value, axis: int, ndim: int) -> Value:
    """``[N, *out, k]`` -> ``[N, *out, 1.., k, ..1]`` with k at tap axis ``axis`` of ``ndim``."""
    lead = v.type.shape[:-1]
    k = v.type.shape[-1]
    return b.reshape(v, lead + tuple(k if i == axis else 1 for i in range(ndim)))


def _combine(b: Builder, parts: list[Value | None], fn: F) -> Value | None:
    """Combine per-axis ``[N, *out, k_i]`` tensors over the tap grid with ``fn``."""
    present = [(i, p) for i, p in enumerate(parts) if p is not None]
    if not present:
        return None
    out = _spread(b, present[0][1], present[0][0], len(parts))
    for i, p in present[1:]:
        out = b.map(fn, out, _spread(b, p, i, len(parts)))
    return out


def _options(ctx: NodeContext, x: Value) -> tuple[str, str, bool]:
    mode = MODES.get(ctx.attr("mode", "linear"))
    padding = ctx.attr("padding_mode", "zeros")
    if mode is None:
        raise ctx.unsupported(f"mode={ctx.attr('mode')!r}")
    if padding not in PADDINGS:
        raise ctx.unsupported(f"padding_mode={padding!r}")
    if mode != "nearest" and not x.type.dtype.is_float:
        raise ctx.unsupported(f"mode={mode!r} on {x.type.dtype} data (interpolation needs floats)")
    return mode, padding, bool(ctx.attr("align_corners", 0))


def _gather_taps(b: Builder, data: Value, indices: list[Value]) -> Value:
    """Read ``data [N, C, *S]`` at every combination of the axes' taps: one GatherND
    from the channels-last image -> ``[N, *out, *taps, C]``."""
    d = len(indices)
    full = indices[0].type.shape[:-1] + tuple(v.type.shape[-1] for v in indices)
    coords = [b.reshape(b.broadcast(_spread(b, v, i, d), full), full + (1,)) for i, v in enumerate(indices)]
    channels_last = b.transpose(data, (0, *range(2, d + 2), 1))
    return b.emit1(GatherND(1), channels_last, b.concat(coords, len(full)))


def _weighted_sum(b: Builder, values: Value, weights: list[Value | None], inside: list[Value | None]) -> Value:
    """``[N, *out, *taps, C]`` -> ``[N, *out, C]``: the taps weighted (taps outside the
    image, under zero padding, weigh 0) and added."""
    d = len(weights)
    weight = _combine(b, weights, F.MUL)
    mask = _combine(b, inside, F.AND)
    if mask is not None:
        kept = weight if weight is not None else b.scalar_like(1, values)
        weight = b.map(F.WHERE, mask, kept, b.scalar_like(0, values))
    lead = values.type.rank - 1 - d
    if weight is None:  # nearest, no zero padding: a single tap, nothing to add
        return b.reshape(values, values.type.shape[:lead] + values.type.shape[-1:])
    values = b.map(F.MUL, values, b.reshape(weight, weight.type.shape + (1,)))
    return b.reduce(ReduceFn.SUM, values, tuple(range(lead, lead + d)), keepdims=False)


@converter("GridSample", since=16)
def grid_sample(ctx: NodeContext) -> Value:
    """Sample ``X [N, C, *S]`` at ``grid [N, *out, D]`` (normalized, last axis first)
    -> ``[N, C, *out]``; nearest/linear/cubic (bilinear/bicubic before opset 20),
    zeros/border/reflection padding, align_corners."""
    b, x, grid = ctx.b, ctx.input(0), ctx.input(1)
    mode, padding, align_corners = _options(ctx, x)
    d = x.type.rank - 2
    spatial = x.type.shape[2:]
    if d < 1 or grid.type.rank != d + 2 or grid.type.shape[0] != x.type.shape[0] or grid.type.shape[-1] != d:
        raise ctx.error(f"grid must be [N, *out, {d}] for X {x.type}, got {grid.type}")
    data = to_compute(b, x) if x.type.dtype.is_float else x
    g32 = b.cast(grid, DType.FLOAT32)
    indices, weights, inside = [], [], []
    for axis in range(d):
        # The grid's last axis lists coordinates innermost axis first (x, y, z).
        g = b.slice(g32, d + 1, d - 1 - axis, d - axis)
        coord = _pixel_coordinate(b, g, spatial[axis], align_corners, mode)
        idx, w, ok = _axis_taps(b, coord, spatial[axis], align_corners, mode, padding, data.type.dtype)
        indices.append(idx)
        weights.append(w)
        inside.append(ok)
    y = _weighted_sum(b, _gather_taps(b, data, indices), weights, inside)  # [N, *out, C]
    y = b.transpose(y, (0, d + 1, *range(1, d + 1)))
    return b.cast(y, x.type.dtype)
