"""Indexed reads and writes: Gather*, Scatter*, and the ops built from constant gathers
(ReverseSequence, Compress).

Indices may be computed at run time (the primitives wrap negative indices; kernels check
them where they use them, and an index out of range fails the run); constant indices
are checked here. The operands that decide an output shape (Compress's condition,
ReverseSequence's lengths) must be compile-time constants.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.shape_ops import const_operand, normalize_axis
from tilefuse.frontend.registry import converter
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import (
    Gather,
    GatherElements,
    GatherND,
    ScatterElements,
    ScatterND,
    ScatterReduction,
)


def _check_constant(ctx: NodeContext, indices: Value, extents: Sequence[int]) -> None:
    """Constant indices must lie in [-n, n) on each coordinate's axis (``extents``: one,
    or, for the ND ops, one per coordinate on the last axis)."""
    if not indices.is_constant or not extents:
        return
    coords = np.asarray(indices.data).astype(np.int64).reshape(-1, len(extents))
    for j, n in enumerate(extents):
        bad = (coords[:, j] < -n) | (coords[:, j] >= n)
        if np.any(bad):
            where = f" (coordinate {j})" if len(extents) > 1 else ""
            raise ctx.error(f"indices hold {int(coords[bad, j][0])}{where}, outside [-{n}, {n})")


def _last(indices: Value) -> int:
    return indices.type.shape[-1] if indices.type.rank else 0


@converter("Gather")
def gather(ctx: NodeContext) -> Value:
    data, indices = ctx.input(0), ctx.input(1)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), data.type.rank)
    _check_constant(ctx, indices, (data.type.shape[axis],))
    return ctx.b.emit1(Gather(axis), data, indices)


@converter("GatherElements", since=11)
def gather_elements(ctx: NodeContext) -> Value:
    data, indices = ctx.input(0), ctx.input(1)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), data.type.rank)
    _check_constant(ctx, indices, (data.type.shape[axis],))
    return ctx.b.emit1(GatherElements(axis), data, indices)


@converter("GatherND", since=11)
def gather_nd(ctx: NodeContext) -> Value:
    data, indices = ctx.input(0), ctx.input(1)
    batch_dims = int(ctx.attr("batch_dims", 0))
    _check_constant(ctx, indices, data.type.shape[batch_dims : batch_dims + _last(indices)])
    return ctx.b.emit1(GatherND(batch_dims), data, indices)


def _reduction(ctx: NodeContext) -> ScatterReduction:
    name = ctx.attr("reduction", "none")
    try:
        return ScatterReduction(name)
    except ValueError:
        raise ctx.unsupported(f"reduction={name}") from None


@converter("ScatterND", since=11)
def scatter_nd(ctx: NodeContext) -> Value:
    data, indices = ctx.input(0), ctx.input(1)
    _check_constant(ctx, indices, data.type.shape[: _last(indices)])
    return ctx.b.emit1(ScatterND(_reduction(ctx)), data, indices, ctx.input(2))


def _scatter_elements(ctx: NodeContext) -> Value:
    data, indices = ctx.input(0), ctx.input(1)
    axis = normalize_axis(ctx, ctx.attr("axis", 0), data.type.rank)
    _check_constant(ctx, indices, (data.type.shape[axis],))
    return ctx.b.emit1(ScatterElements(axis, _reduction(ctx)), data, indices, ctx.input(2))


converter("ScatterElements", since=11)(_scatter_elements)
# Scatter (opsets 9-10) is ScatterElements under its old name.
converter("Scatter", since=9)(_scatter_elements)


@converter("ReverseSequence", since=10)
def reverse_sequence(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    lens = ctx.const_input(1).reshape(-1).astype(np.int64)
    rank = x.type.rank
    batch_axis = normalize_axis(ctx, ctx.attr("batch_axis", 1), rank)
    time_axis = normalize_axis(ctx, ctx.attr("time_axis", 0), rank)
    if rank < 2 or batch_axis == time_axis:
        raise ctx.error("batch_axis and time_axis must be two different axes")
    batch, time = x.type.shape[batch_axis], x.type.shape[time_axis]
    if lens.shape != (batch,) or np.any(lens < 0) or np.any(lens > time):
        raise ctx.error(f"sequence_lens {lens.tolist()} do not fit batch {batch} and time {time}")
    # Move (batch, time) to the front and merge them; one Gather with a constant index
    # vector then reverses each sequence's first lens[i] steps.
    rest = [a for a in range(rank) if a not in (batch_axis, time_axis)]
    perm = [batch_axis, time_axis] + rest
    inner = tuple(x.type.shape[a] for a in rest)
    t = np.arange(time)
    source = np.where(t[None, :] < lens[:, None], lens[:, None] - 1 - t[None, :], t[None, :])
    flat = (np.arange(batch)[:, None] * time + source).reshape(-1)
    merged = b.reshape(b.transpose(x, perm), (batch * time,) + inner)
    y = b.emit1(Gather(0), merged, b.const(flat.astype(np.int64)))
    y = b.reshape(y, (batch, time) + inner)
    return b.transpose(y, [perm.index(a) for a in range(rank)])


@converter("Compress", since=9)
def compress(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    condition = const_operand(ctx, 1, "Compress's output shape depends on the condition's values")
    axis = ctx.attr("axis")
    if axis is None:  # select from the flattened input
        x = b.reshape(x, (x.type.size,))
        axis = 0
    axis = normalize_axis(ctx, axis, x.type.rank)
    keep = np.asarray(condition).reshape(-1).astype(bool)
    dim = x.type.shape[axis]
    if keep.size > dim:
        if np.any(keep[dim:]):
            raise ctx.error(f"condition selects index >= {dim}")
        keep = keep[:dim]
    picked = np.nonzero(keep)[0].astype(np.int64)
    if picked.size == dim:
        return x
    return b.emit1(Gather(axis), x, b.const(picked))
