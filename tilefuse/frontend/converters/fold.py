"""Inverses of sliding-window reads: MaxUnpool and Col2Im (fold) -> scatter primitives.

Both write values back to the image positions their windows came from: MaxUnpool to
the flat positions MaxPool reported (ScatterND into zeros), Col2Im to every position a
block covers, adding where blocks overlap (ScatterElements with ``add`` into a zero,
padded image whose positions are a constant table, then a Slice that drops the pads).
"""
from __future__ import annotations

import math

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import scalar, to_compute
from tilefuse.frontend.converters.spatial import span
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import ScatterElements, ScatterND, ScatterReduction, Slice


def zeros(b: Builder, like: Value, shape: tuple[int, ...]) -> Value:
    """A zero tensor of ``like``'s dtype: a broadcast scalar, not a stored weight."""
    return b.broadcast(scalar(b, 0, like), shape)


def _ints(ctx: NodeContext, name: str, k: int, default: int) -> tuple[int, ...]:
    value = ctx.attr(name) or [default] * k
    if len(value) != k:
        raise ctx.error(f"{name} has {len(value)} values, expected {k}")
    return tuple(int(v) for v in value)


# -- MaxUnpool --------------------------------------------------------------------------
def _unpooled_shape(ctx: NodeContext, x: Value) -> tuple[int, ...]:
    """``output_shape`` if given, else ``(in - 1) * stride + kernel - pads`` per spatial dim."""
    given = ctx.optional_input(2)
    if given is not None:
        shape = tuple(int(d) for d in ctx.const_input(2).reshape(-1))
        if len(shape) != x.type.rank or shape[:2] != x.type.shape[:2]:
            raise ctx.error(f"output_shape {list(shape)} does not match input {x.type}")
        return shape
    kernel = tuple(int(k) for k in ctx.attr("kernel_shape"))
    k = len(kernel)
    if k != x.type.rank - 2:
        raise ctx.error(f"kernel_shape {list(kernel)} does not match input {x.type}")
    strides, pads = _ints(ctx, "strides", k, 1), _ints(ctx, "pads", 2 * k, 0)
    sizes = x.type.shape[2:]
    spatial = tuple((sizes[i] - 1) * strides[i] + kernel[i] - pads[i] - pads[i + k] for i in range(k))
    return x.type.shape[:2] + spatial


@converter("MaxUnpool", since=9)
def max_unpool(ctx: NodeContext) -> Value:
    """Zeros with each ``X`` value written at its flat index ``I`` into the output.

    With ``output_shape``, indices count positions of that shape, as onnxruntime and
    PyTorch read them (the ONNX reference instead reads them in the shape the
    attributes imply and pads the result; the two agree without ``output_shape``).
    """
    b, x, indices = ctx.b, ctx.input(0), ctx.input(1)
    if x.type.rank < 3 or indices.type.shape != x.type.shape:
        raise ctx.error(f"X must be [N, C, d...] and I the same shape, got {x.type} and {indices.type}")
    shape = _unpooled_shape(ctx, x)
    flat = zeros(b, x, (math.prod(shape),))
    where = b.reshape(indices, (x.type.size, 1))
    y = b.emit1(ScatterND(ScatterReduction.NONE), flat, where, b.reshape(x, (x.type.size,)))
    return b.reshape(y, shape)


# -- Col2Im -----------------------------------------------------------------------------
def col2im_positions(padded: tuple[int, ...], block: tuple[int, ...], strides, dilations) -> np.ndarray:
    """``[prod(block), L]`` flat positions in the padded image of each block element
    (rows: offsets inside a block, lexicographic) of each block (columns)."""
    counts = [(p - span(k, d)) // s + 1 for p, k, s, d in zip(padded, block, strides, dilations)]
    grids = np.meshgrid(*[np.arange(k) for k in block], *[np.arange(c) for c in counts], indexing="ij")
    d = len(block)
    coords = [grids[i] * dilations[i] + grids[d + i] * strides[i] for i in range(d)]
    flat = np.ravel_multi_index(coords, padded)
    return flat.reshape(math.prod(block), math.prod(counts)).astype(np.int64)


@converter("Col2Im", since=18)
def col2im(ctx: NodeContext) -> Value:
    """Sum the column blocks ``[N, C * prod(block_shape), L]`` back into an image
    ``[N, C, *image_shape]``; strides, dilations and pads as in a convolution."""
    b, x = ctx.b, ctx.input(0)
    image = tuple(int(v) for v in ctx.const_input(1).reshape(-1))
    block = tuple(int(v) for v in ctx.const_input(2).reshape(-1))
    k = len(image)
    if len(block) != k or x.type.rank != 3:
        raise ctx.error(f"need input [N, C*K, L] and equally long image and block shapes: {x.type}, {image}, {block}")
    strides, dilations = _ints(ctx, "strides", k, 1), _ints(ctx, "dilations", k, 1)
    pads = _ints(ctx, "pads", 2 * k, 0)
    padded = tuple(image[i] + pads[i] + pads[i + k] for i in range(k))
    positions = col2im_positions(padded, block, strides, dilations)
    n, ck, blocks = x.type.shape
    taps = math.prod(block)
    if ck % taps or positions.shape[1] != blocks:
        raise ctx.error(f"input {x.type} does not hold C * {taps} rows of {positions.shape[1]} blocks")
    c = ck // taps
    xc = to_compute(b, x)  # half floats add in float32
    updates = b.reshape(xc, (n, c, taps * blocks))
    where = b.broadcast(b.const(positions.reshape(1, 1, -1)), updates.type.shape)
    flat = zeros(b, xc, (n, c, math.prod(padded)))
    y = b.emit1(ScatterElements(2, ScatterReduction.ADD), flat, where, updates)
    y = b.reshape(y, (n, c) + padded)
    if any(pads):
        op = Slice((0, 0) + pads[:k], (1,) * (k + 2), (n, c) + image)
        y = b.emit1(op, y)
    return b.cast(y, x.type.dtype)
