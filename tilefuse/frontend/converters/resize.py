"""Resize and Upsample -> constant Gathers and weighted sums, one axis at a time.

Every Resize mode is separable: along one axis, output position i reads a few input
positions ``idx[i, k]`` with weights ``w[i, k]``, and both depend only on static
sizes and attributes. They are computed here with numpy, so the graph gets

- nearest: one Gather with a constant index vector;
- linear / cubic (antialiased or not): one Gather per tap, each multiplied by a
  constant weight vector broadcast along the axis, summed.

Half floats are computed in float32, and integers in float (saturated and cast back
at the end).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.shape_ops import normalize_axes
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Gather
from tilefuse.ir.prims import ScalarFn as F

_COORD_MODES = {
    "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize",
}
_NEAREST_MODES = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}


@dataclass(frozen=True)
class _Options:
    mode: str  # nearest | linear | cubic
    coord: str
    nearest_mode: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False
    extrapolation_value: float = 0.0


@dataclass(frozen=True)
class _AxisPlan:
    """How one axis is resized: ``y[i] = sum_k w[i, k] * x[idx[i, k]]``."""

    axis: int
    idx: np.ndarray  # (out, taps) int64, within [0, in)
    w: np.ndarray  # (out, taps) float64
    outside: np.ndarray | None  # (out,) bool: tf_crop_and_resize extrapolated positions


@converter("Resize", since=11)
def resize(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    opts = _options(ctx)
    axes = ctx.attr("axes")  # opset 18
    axes = list(range(x.type.rank)) if axes is None else normalize_axes(ctx, axes, x.type.rank)
    dims = [x.type.shape[a] for a in axes]
    factors, outs = _scales_and_sizes(ctx, dims)
    rois = _rois(ctx, opts, len(axes))
    plans = [
        _plan_axis(axis, n, out, scale, opts, roi)
        for axis, n, out, scale, roi in zip(axes, dims, outs, factors, rois)
        if not _is_identity(n, out, scale, roi)
    ]
    return _emit(ctx.b, x, plans, opts)


def _scales_and_sizes(ctx: NodeContext, dims: list[int]) -> tuple[list[float], list[int]]:
    """Per resized axis: the scale factor the coordinate maps use, and the output size."""
    scales, sizes = _floats_or_none(ctx, 2), _floats_or_none(ctx, 3)
    if (scales is None) == (sizes is None):
        raise ctx.error("exactly one of scales and sizes must be given")
    given = scales if scales is not None else sizes
    assert given is not None  # exactly one of them is
    if len(given) != len(dims):
        raise ctx.error(f"{len(given)} scales/sizes for {len(dims)} axes")
    if sizes is not None:
        return _sizes_to_scales(ctx, [int(s) for s in sizes], dims)
    if any(s <= 0 for s in given):
        raise ctx.error(f"scales must be positive, got {given}")
    # floor(dim * scale), the roi not included, as the reference computes it.
    return list(given), [int(math.floor(s * d)) for s, d in zip(given, dims)]


def _rois(ctx: NodeContext, opts: _Options, n_axes: int) -> list[tuple[float, float]]:
    """Per resized axis, the (start, end) of the region read; only tf_crop_and_resize has one."""
    roi = _floats_or_none(ctx, 1) if opts.coord == "tf_crop_and_resize" else None
    if roi is None:
        return [(0.0, 1.0)] * n_axes
    if len(roi) != 2 * n_axes:
        raise ctx.error(f"roi has {len(roi)} values, expected {2 * n_axes}")
    return list(zip(roi[:n_axes], roi[n_axes:]))


def _is_identity(n: int, out: int, scale: float, roi: tuple[float, float]) -> bool:
    return out == n and math.isclose(scale, 1.0) and math.isclose(roi[0], 0.0) and math.isclose(roi[1], 1.0)


@converter("Upsample", since=7)
def upsample(ctx: NodeContext) -> Value:
    """Upsample (opsets 7-9): Resize with asymmetric coordinates and floor rounding.

    Models this old are upgraded to opset 13 before conversion, which rewrites
    Upsample as Resize; this entry is what lets the coverage check accept them.
    """
    x = ctx.input(0)
    scales = list(ctx.attr("scales")) if ctx.opset < 9 else _floats_or_none(ctx, 1)
    if scales is None or len(scales) != x.type.rank:
        raise ctx.error(f"scales must have one value per axis, got {scales}")
    opts = _Options(_mode(ctx), "asymmetric", nearest_mode="floor")
    outs = [int(math.floor(s * d)) for s, d in zip(scales, x.type.shape)]
    plans = [
        _plan_axis(a, d, out, s, opts, (0.0, 1.0))
        for a, (d, out, s) in enumerate(zip(x.type.shape, outs, scales))
        if not _is_identity(d, out, s, (0.0, 1.0))
    ]
    return _emit(ctx.b, x, plans, opts)


def _mode(ctx: NodeContext) -> str:
    mode = ctx.attr("mode", "nearest")
    if mode == "bilinear":  # Upsample-7's name for linear on 4-D inputs
        mode = "linear"
    if mode not in ("nearest", "linear", "cubic"):
        raise ctx.unsupported(f"mode={mode}")
    return mode


def _options(ctx: NodeContext) -> _Options:
    coord = ctx.attr("coordinate_transformation_mode", "half_pixel")
    nearest_mode = ctx.attr("nearest_mode", "round_prefer_floor")
    if coord not in _COORD_MODES:
        raise ctx.unsupported(f"coordinate_transformation_mode={coord}")
    if nearest_mode not in _NEAREST_MODES:
        raise ctx.unsupported(f"nearest_mode={nearest_mode}")
    return _Options(
        mode=_mode(ctx),
        coord=coord,
        nearest_mode=nearest_mode,
        cubic_a=float(ctx.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(ctx.attr("exclude_outside", 0)),
        antialias=bool(ctx.attr("antialias", 0)),
        extrapolation_value=float(ctx.attr("extrapolation_value", 0.0)),
    )


def _floats_or_none(ctx: NodeContext, i: int) -> list[float] | None:
    """A constant float operand; absent and empty (the old way to skip one) are None."""
    array = ctx.optional_const_input(i)
    if array is None or array.size == 0:
        return None
    return [float(v) for v in array.reshape(-1)]


def _sizes_to_scales(ctx: NodeContext, sizes: list[int], dims: list[int]) -> tuple[list[float], list[int]]:
    """Scale factors and output sizes from ``sizes`` under keep_aspect_ratio_policy."""
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    ratios = [s / d if d else 1.0 for s, d in zip(sizes, dims)]
    if policy == "stretch":
        return ratios, sizes
    if policy not in ("not_larger", "not_smaller"):
        raise ctx.unsupported(f"keep_aspect_ratio_policy={policy}")
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    return [scale] * len(dims), [int(scale * d + 0.5) for d in dims]  # round half up


# -- per-axis sampling plans (numpy, at compile time) ------------------------------------


def _plan_axis(axis: int, n_in: int, n_out: int, scale: float, opts: _Options, roi: tuple[float, float]) -> _AxisPlan:
    x, outside = _source_coords(n_in, n_out, scale, opts.coord, roi)
    left = np.floor(x)
    # ratio in (0, 1]: an exact integer coordinate counts as the right end of the
    # interval that starts one to its left (so left + 1 is the coordinate itself).
    ratio = np.where(x == left, 1.0, x - left)
    left = left - (ratio == 1.0)
    offsets, w = _weights(ratio, scale, opts)
    idx = left[:, None].astype(np.int64) + offsets[None, :]
    if opts.exclude_outside:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    # Positions outside the input read its edge (the reference pads in edge mode).
    return _AxisPlan(axis, np.clip(idx, 0, max(n_in - 1, 0)), w, outside)


def _source_coords(
    n_in: int, n_out: int, scale: float, coord: str, roi: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each output position's coordinate in the input, per coordinate_transformation_mode.

    ``width`` is the fractional output length ``scale * n_in``, as in the reference.
    """
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in
    if coord == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if coord == "half_pixel_symmetric":
        offset = (n_in / 2) * (1 - n_out / width)
        return offset + (y + 0.5) / scale - 0.5, None
    if coord == "pytorch_half_pixel":
        return ((y + 0.5) / scale - 0.5 if width != 1 else np.full(n_out, -0.5)), None
    if coord == "align_corners":
        return (y * (n_in - 1) / (width - 1) if width != 1 else np.zeros(n_out)), None
    if coord == "asymmetric":
        return y / scale, None
    lo, hi = roi  # tf_crop_and_resize
    if width != 1:
        x = y * (hi - lo) * (n_in - 1) / (width - 1)
    else:
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2)
    x = x + lo * (n_in - 1)
    return x, (x < 0) | (x > n_in - 1)


def _weights(ratio: np.ndarray, scale: float, opts: _Options) -> tuple[np.ndarray, np.ndarray]:
    """Tap offsets (relative to each row's left neighbour) and their weights."""
    if opts.mode == "nearest":
        return np.array([0, 1]), _nearest_weights(ratio, opts.nearest_mode)
    # Antialiasing stretches the filter by 1/scale when downsampling; its weights are
    # then normalised to sum to one.
    stretch = min(scale, 1.0) if opts.antialias else 1.0
    support = 1.0 if opts.mode == "linear" else 2.0
    start = int(math.floor(-support / stretch)) + 1
    offsets = np.arange(start, 1 - start + 1)
    t = np.abs((offsets[None, :] - ratio[:, None]) * stretch)
    w = np.clip(1 - t, 0, 1) if opts.mode == "linear" else _cubic(t, opts.cubic_a)
    if opts.antialias:
        w = w / w.sum(axis=1, keepdims=True)
    return offsets, w


def _nearest_weights(ratio: np.ndarray, mode: str) -> np.ndarray:
    """One-hot weights over (left, left + 1); ratio == 1 means x is left + 1 exactly."""
    if mode == "round_prefer_floor":
        right = ratio > 0.5
    elif mode == "round_prefer_ceil":
        right = ratio >= 0.5
    elif mode == "floor":
        right = ratio == 1.0
    else:  # ceil
        right = np.ones_like(ratio, dtype=bool)
    return np.stack([~right, right], axis=1).astype(np.float64)


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances ``t >= 0``."""
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


# -- emission ----------------------------------------------------------------------------


# Input dtypes whose values float32 cannot hold exactly: computed in float64.
_WIDE = {DType.FLOAT64, DType.INT32, DType.INT64, DType.UINT32, DType.UINT64}


def _emit(b: Builder, x: Value, plans: list[_AxisPlan], opts: _Options) -> Value:
    dtype = x.type.dtype
    arithmetic = any(not _is_selection(p.w) for p in plans) or any(p.outside is not None for p in plans)
    if not arithmetic:  # nearest: pure data movement, in the input's dtype
        for p in plans:
            x = _gather_along(b, x, p.axis, _selected(p))
        return x
    compute = DType.FLOAT64 if dtype in _WIDE else DType.FLOAT32
    y = b.cast(x, compute)
    for p in plans:
        y = _resize_axis(b, y, p)
        if p.outside is not None and p.outside.any():
            mask = b.const(p.outside.reshape(_along(p.axis, y.type.rank, len(p.outside))))
            y = b.map(F.WHERE, mask, b.scalar_like(opts.extrapolation_value, y), y)
    return _cast_back(b, y, dtype)


# Filters wider than this (antialiased strong downscaling) become one product with a
# dense constant (in, out) matrix instead of one Gather per tap.
_MAX_GATHER_TAPS = 8


def _resize_axis(b: Builder, x: Value, p: _AxisPlan) -> Value:
    if _is_selection(p.w):
        return _gather_along(b, x, p.axis, _selected(p))
    if int(np.count_nonzero(p.w.any(axis=0))) > _MAX_GATHER_TAPS:
        return _resize_axis_dense(b, x, p)
    shape = _along(p.axis, x.type.rank, p.w.shape[0])
    acc: Value | None = None
    for k in range(p.w.shape[1]):
        if not np.any(p.w[:, k]):
            continue  # a tap no output position uses
        weight = b.const(p.w[:, k].reshape(shape).astype(x.type.dtype.numpy))
        term = b.map(F.MUL, _gather_along(b, x, p.axis, p.idx[:, k]), weight)
        acc = term if acc is None else b.map(F.ADD, acc, term)
    assert acc is not None, "every output position has a non-zero weight"
    return acc


def _resize_axis_dense(b: Builder, x: Value, p: _AxisPlan) -> Value:
    """``y = x @ M`` along the axis, with ``M[j, i]`` the weight of input j for output i."""
    n_in, n_out = x.type.shape[p.axis], p.w.shape[0]
    matrix = np.zeros((n_in, n_out))
    np.add.at(matrix, (p.idx, np.arange(n_out)[:, None]), p.w)
    rank = x.type.rank
    perm = [a for a in range(rank) if a != p.axis] + [p.axis]
    moved = b.transpose(x, perm)
    rows = moved.type.shape[:-1]
    flat = b.reshape(moved, (int(np.prod(rows)), n_in))
    y = b.matmul(flat, b.const(matrix.astype(x.type.dtype.numpy)))
    y = b.reshape(y, rows + (n_out,))
    return b.transpose(y, [perm.index(a) for a in range(rank)])


def _is_selection(w: np.ndarray) -> bool:
    """True when each output position copies exactly one input position."""
    return bool(np.all((w == 0) | (w == 1)) and np.all(w.sum(axis=1) == 1)) if w.size else True


def _selected(p: _AxisPlan) -> np.ndarray:
    return p.idx[np.arange(p.idx.shape[0]), np.argmax(p.w, axis=1)] if p.w.size else np.zeros(0, np.int64)


def _gather_along(b: Builder, x: Value, axis: int, idx: np.ndarray) -> Value:
    if idx.shape[0] == x.type.shape[axis] and np.array_equal(idx, np.arange(idx.shape[0])):
        return x
    return b.emit1(Gather(axis), x, b.const(idx.astype(np.int64)))


def _along(axis: int, rank: int, n: int) -> tuple[int, ...]:
    """The shape of a vector of length ``n`` laid along ``axis`` of a rank-``rank`` tensor."""
    return tuple(n if a == axis else 1 for a in range(rank))


def _cast_back(b: Builder, y: Value, dtype: DType) -> Value:
    """Float results to the input dtype; integers saturate and truncate toward zero, as
    ONNX Runtime does (the onnx reference rounds to nearest instead)."""
    if dtype.is_int:
        info = np.iinfo(dtype.numpy)
        y = b.map(F.MIN, b.map(F.MAX, y, b.scalar_like(info.min, y)), b.scalar_like(info.max, y))
    return b.cast(y, dtype)
