"""Pure data-movement ONNX ops -> Index primitives.

Reshaping, transposing, slicing, concatenating, padding, tiling and the
depth/space shuffles. Every operand that decides a shape (Reshape's shape, Slice's
bounds, Pad's pads, ...) must be known at compile time: shapes are static.

The rest of the movement family lives next door and is registered by importing it
here: gathers and scatters (gather_scatter.py), Resize (resize.py), and the ops that
make tensors from shapes and constants (shape_ops.py).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters import gather_scatter, resize  # noqa: F401  (register on import)
from tilefuse.frontend.converters.shape_ops import (
    const_ints,
    ints_operand,
    normalize_axes,
    normalize_axis,
)
from tilefuse.frontend.registry import converter
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Pad, PadMode, Slice
from tilefuse.ir.types import broadcast_shapes


@converter("Transpose")
def transpose(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    perm = ctx.attr("perm")
    perm = list(range(x.type.rank))[::-1] if perm is None else normalize_axes(ctx, perm, x.type.rank)
    return ctx.b.transpose(x, perm)


@converter("Reshape", since=5)
def reshape(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    target = const_ints(ctx, 1) or []
    return ctx.b.reshape(x, _resolve_reshape(ctx, x.type.shape, target, bool(ctx.attr("allowzero", 0))))


def _resolve_reshape(ctx: NodeContext, dims: Sequence[int], target: list[int], allowzero: bool) -> list[int]:
    """ONNX Reshape's rules: 0 copies the input dim (unless allowzero), one -1 is inferred."""
    out = [dims[i] if d == 0 and not allowzero and i < len(dims) else d for i, d in enumerate(target)]
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise ctx.error(f"invalid shape {target}")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(dims)
        if known == 0 or total % known:
            raise ctx.error(f"cannot reshape {list(dims)} to {target}")
        out[out.index(-1)] = total // known
    if math.prod(out) != math.prod(dims):
        raise ctx.error(f"cannot reshape {list(dims)} to {target}")
    return out


@converter("Flatten")
def flatten(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    rank = x.type.rank
    axis = int(ctx.attr("axis", 1))
    if not -rank <= axis <= rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    dims = x.type.shape
    return ctx.b.reshape(x, (math.prod(dims[:axis]), math.prod(dims[axis:])))


@converter("Squeeze")
def squeeze(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    dims = x.type.shape
    axes = ints_operand(ctx, 1, "axes")
    if axes is None:
        drop = {i for i, d in enumerate(dims) if d == 1}
    else:
        drop = set(normalize_axes(ctx, axes, len(dims)))
        if any(dims[a] != 1 for a in drop):
            raise ctx.error(f"cannot squeeze axes {axes} of shape {list(dims)}: not all of size 1")
    return ctx.b.reshape(x, [d for i, d in enumerate(dims) if i not in drop])


@converter("Unsqueeze")
def unsqueeze(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    axes = ints_operand(ctx, 1, "axes")
    if axes is None:
        raise ctx.error("axes are required")
    rank = x.type.rank + len(axes)
    new = set(normalize_axes(ctx, axes, rank))
    rest = iter(x.type.shape)
    return ctx.b.reshape(x, [1 if i in new else next(rest) for i in range(rank)])


@converter("Expand", since=8)
def expand(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    target = tuple(const_ints(ctx, 1) or [])
    try:
        out = broadcast_shapes(x.type.shape, target)
    except ValueError:
        raise ctx.error(f"shape {list(x.type.shape)} does not broadcast with {list(target)}") from None
    return ctx.b.broadcast(ctx.b.reshape(x, (1,) * (len(out) - x.type.rank) + x.type.shape), out)


@converter("Concat")
def concat(ctx: NodeContext) -> Value:
    xs = [v for v in ctx.inputs if v is not None]
    axis = normalize_axis(ctx, ctx.attr("axis", 0), xs[0].type.rank)
    # Empty inputs add nothing; keep one so that the result has the right type.
    non_empty = [v for v in xs if v.type.shape[axis] > 0] or xs[:1]
    return ctx.b.concat(non_empty, axis)


@converter("Split")
def split(ctx: NodeContext) -> list[Value]:
    x = ctx.input(0)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), x.type.rank)
    dim = x.type.shape[axis]
    sizes = ints_operand(ctx, 1, "split")
    if sizes is None:
        count = ctx.attr("num_outputs") or len(ctx.node.output)
        # Equal parts; when they do not divide, all but the last are ceil(dim / count).
        part = -(-dim // count)
        sizes = [part] * (count - 1) + [dim - part * (count - 1)]
        if sizes[-1] < 0:
            raise ctx.error(f"cannot split {dim} into {count} parts")
    if sum(sizes) != dim or min(sizes, default=0) < 0:
        raise ctx.error(f"split sizes {sizes} do not add up to dim {dim}")
    offsets = np.cumsum([0] + sizes)
    return [ctx.b.slice(x, axis, int(offsets[i]), int(offsets[i + 1])) for i in range(len(sizes))]


@converter("Slice", since=10)
def slice_(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    starts, ends, axes, steps = (const_ints(ctx, i) for i in range(1, 5))
    if starts is None or ends is None or len(starts) != len(ends):
        raise ctx.error("starts and ends are required and must have equal lengths")
    axes = list(range(len(starts))) if axes is None else normalize_axes(ctx, axes, x.type.rank)
    steps = [1] * len(starts) if steps is None else steps
    if not len(axes) == len(steps) == len(starts):
        raise ctx.error("starts, ends, axes and steps must have equal lengths")
    return slice_axes(ctx, x, dict(zip(axes, zip(starts, ends, steps))))


def slice_axes(ctx: NodeContext, x: Value, bounds: dict[int, tuple[int, int, int]]) -> Value:
    """ONNX Slice semantics: negative bounds count from the end, and bounds out of range
    are clamped: start and end to [0, dim] for positive steps; for negative ones, start
    to [0, dim-1] and end to [-1, dim-1]."""
    dims = x.type.shape
    starts, steps, counts = [0] * len(dims), [1] * len(dims), list(dims)
    for axis, (start, end, step) in bounds.items():
        n = dims[axis]
        if step == 0:
            raise ctx.error("slice step must not be zero")
        start, end = start + n if start < 0 else start, end + n if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), n), min(max(end, 0), n)
        else:
            start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
        count = max(0, -(-(end - start) // step))
        starts[axis], steps[axis], counts[axis] = (start if count else 0), step, count
    if counts == list(dims) and all(s == 1 for s in steps):
        return x
    return ctx.b.emit1(Slice(tuple(starts), tuple(steps), tuple(counts)), x)


_PAD_MODES = {m.value: m for m in PadMode}


@converter("Pad", since=11)
def pad(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    mode = ctx.attr("mode", "constant")
    if mode not in _PAD_MODES:
        raise ctx.unsupported(f"mode={mode}")
    pads = const_ints(ctx, 1) or []
    fill = ctx.optional_const_input(2)
    value = fill.reshape(-1)[0].item() if fill is not None and fill.size else 0
    rank = x.type.rank
    axes = const_ints(ctx, 3)  # opset 18
    axes = list(range(rank)) if axes is None else normalize_axes(ctx, axes, rank)
    if len(pads) != 2 * len(axes):
        raise ctx.error(f"pads {pads} do not match {len(axes)} axes")
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[len(axes) + i]
    return pad_value(ctx, x, begin, end, _PAD_MODES[mode], value)


def pad_value(ctx: NodeContext, x: Value, begin: list[int], end: list[int], mode: PadMode, value: float | int | bool = 0) -> Value:
    """Pad by per-axis amounts; negative amounts crop (a Slice first, then the Pad)."""
    dims = x.type.shape
    crops = {
        a: (max(-begin[a], 0), dims[a] - max(-end[a], 0), 1) for a in range(len(dims)) if min(begin[a], end[a]) < 0
    }
    if any(lo > hi for lo, hi, _ in crops.values()):
        raise ctx.error(f"pads crop more than the input: {begin + end} for {list(dims)}")
    x = slice_axes(ctx, x, crops) if crops else x
    widths = tuple(max(p, 0) for p in begin) + tuple(max(p, 0) for p in end)
    if not any(widths):
        return x
    if mode is not PadMode.CONSTANT and any(d == 0 for d, lo, hi in zip(x.type.shape, begin, end) if lo > 0 or hi > 0):
        raise ctx.error(f"mode={mode.value} cannot pad an empty axis")
    return ctx.b.emit1(Pad(widths, mode, _python_scalar(value, x) if mode is PadMode.CONSTANT else 0), x)


def _python_scalar(value: float | int | bool, like: Value) -> float | int | bool:
    """The pad value as a Python scalar of the data's kind (the primitive's parameter)."""
    dtype = like.type.dtype
    if dtype.is_float:
        return float(value)
    if dtype.is_int:
        return int(value)
    return bool(value)


@converter("Tile", since=6)
def tile(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    repeats = const_ints(ctx, 1) or []
    dims = x.type.shape
    if len(repeats) != len(dims) or min(repeats, default=0) < 0:
        raise ctx.error(f"repeats {repeats} do not fit shape {list(dims)}")
    # (d0, d1, ...) -> (1, d0, 1, d1, ...) -> broadcast to (r0, d0, r1, d1, ...) -> merge pairs.
    spread = [v for d in dims for v in (1, d)]
    tiled = [v for r, d in zip(repeats, dims) for v in (r, d)]
    y = b.broadcast(b.reshape(x, spread), tiled)
    return b.reshape(y, [r * d for r, d in zip(repeats, dims)])


@converter("DepthToSpace")
def depth_to_space(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    n, c, h, w = _nchw(ctx, x)
    bs = int(ctx.attr("blocksize"))
    mode = ctx.attr("mode", "DCR")
    if c % (bs * bs):
        raise ctx.error(f"channels {c} are not a multiple of blocksize^2 = {bs * bs}")
    oc = c // (bs * bs)
    if mode == "DCR":
        y = b.transpose(b.reshape(x, (n, bs, bs, oc, h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":
        y = b.transpose(b.reshape(x, (n, oc, bs, bs, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise ctx.unsupported(f"mode={mode}")
    return b.reshape(y, (n, oc, h * bs, w * bs))


@converter("SpaceToDepth")
def space_to_depth(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    n, c, h, w = _nchw(ctx, x)
    bs = int(ctx.attr("blocksize"))
    mode = ctx.attr("mode", "DCR")
    if h % bs or w % bs:
        raise ctx.error(f"spatial dims {h}x{w} are not multiples of blocksize {bs}")
    perm = {"DCR": (0, 3, 5, 1, 2, 4), "CRD": (0, 1, 3, 5, 2, 4)}.get(mode)
    if perm is None:
        raise ctx.unsupported(f"mode={mode}")
    y = b.transpose(b.reshape(x, (n, c, h // bs, bs, w // bs, bs)), perm)
    return b.reshape(y, (n, c * bs * bs, h // bs, w // bs))


def _nchw(ctx: NodeContext, x: Value) -> tuple[int, int, int, int]:
    if x.type.rank != 4:
        raise ctx.error(f"input must be 4-D (N, C, H, W), got {x.type}")
    n, c, h, w = x.type.shape
    return n, c, h, w


@converter("CenterCropPad", since=18)
def center_crop_pad(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    target = const_ints(ctx, 1) or []
    rank = x.type.rank
    axes = ctx.attr("axes")
    axes = list(range(rank)) if axes is None else normalize_axes(ctx, axes, rank)
    if len(axes) != len(target):
        raise ctx.error(f"shape {target} does not match axes {axes}")
    begin, end = [0] * rank, [0] * rank
    for a, size in zip(axes, target):
        # Crop: the window starts half the excess in, rounded down. Pad: the odd
        # pixel goes to the end. Both are begin = diff // 2 with signed amounts.
        diff = size - x.type.shape[a]
        lo = diff // 2 if diff >= 0 else -((-diff) // 2)
        begin[a], end[a] = lo, diff - lo
    return pad_value(ctx, x, begin, end, PadMode.CONSTANT, 0)
