"""Rows: row reductions and their elementwise neighbours, no product.

A group whose reductions all reduce the last axis of one shape ``[..., E]`` (dims kept)
is tiled over whole rows: each output element depends only on its own row when
everything downstream of a reduction is elementwise, of the row shape or the per-row
shape, and every output has one of those shapes (or the same rows regrouped, or the
per-row shape without its unit axis). A group
with no reduction at all is the same with rows of its output shape. Gathers, reshapes and
casts before the reductions are the prologue (an embedding lookup, an add, a LayerNorm).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Kind, Map, Reduce, Reshape
from tilefuse.patterns.dataflow import has_empty
from tilefuse.patterns.refusal import Refusal
from tilefuse.patterns.staged import STAGED
from tilefuse.target import Target


@dataclass(frozen=True, slots=True)
class RowsMatch:
    """``reductions`` in group order (a variance reads its mean); ``shape``: the row shape
    ``[..., E]`` every reduction reduces (the first output's with none)."""

    reductions: tuple[Node, ...]
    shape: tuple[int, ...]


def _row_reduction(r: Node, shape: tuple[int, ...]) -> bool:
    op = r.op
    return (isinstance(op, Reduce) and op.keepdims and op.axes == (len(shape) - 1,)
            and r.inputs[0].type.shape == shape)


def same_rows(s: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """``s`` holds the rows of ``shape`` in the same order, regrouped: same last axis, same
    row count."""
    return bool(s) and s[-1] == shape[-1] and math.prod(s[:-1]) == math.prod(shape[:-1])


def _rowwise(nodes: Sequence[Node], reductions: Sequence[Node], shape, row_shape) -> bool:
    """Everything that reads a reduction's result, directly or not, is elementwise (or the
    next reduction) on row-aligned shapes: each element stays in its row. Per-row results
    may drop their unit axis (``[..., 1] -> [...]``, a reduction's keepdims=0), and be
    computed on further in that shape, apart from the row shape."""
    downstream: set[int] = {id(r.outputs[0]) for r in reductions}
    per_row = shape[:-1]
    for n in nodes:
        if not any(id(v) in downstream for v in n.inputs):
            continue
        if n in reductions:
            continue
        out = n.outputs[0].type.shape
        if isinstance(n.op, Reshape) and n.inputs[0].type.shape == shape and same_rows(out, shape):
            downstream.add(id(n.outputs[0]))  # rows kept, only their leading index regrouped ([1, S, E] -> [S, E])
            continue
        if isinstance(n.op, Reshape) and n.inputs[0].type.shape == row_shape and out == per_row:
            downstream.add(id(n.outputs[0]))  # a per-row result without its unit axis
            continue
        if not isinstance(n.op, Map) or out not in (shape, row_shape, per_row):
            return False
        # a per-row result read by an element of the row shape would be read across rows
        allowed = (per_row,) if out == per_row else (shape, row_shape)
        if any(v.type.shape not in allowed and not v.is_constant and v.type.size != 1
               and id(v) in downstream for v in n.inputs):
            return False
        downstream.add(id(n.outputs[0]))
    return True


def match_rows(nodes: Sequence[Node], outputs: Sequence[Value], target: Target) -> RowsMatch | Refusal:
    """The group as row tiles, or why not (rows of any length: the lowering walks one
    longer than a tile holds in chunks)."""
    # contractions, scatters, windowed and arg reductions need the staged schedule
    if any(n.op.kind in (Kind.CONTRACT, Kind.OPAQUE) or (isinstance(n.op, STAGED) and not isinstance(n.op, Reduce))
           for n in nodes):
        return Refusal("a product, scatter, window or arg reduction needs another schedule")
    if has_empty(nodes):
        return Refusal("empty tensors: nothing to tile")
    reductions = [n for n in nodes if n.op.kind is Kind.REDUCE]
    if reductions:
        shape = reductions[0].inputs[0].type.shape
        if not all(_row_reduction(r, shape) for r in reductions):
            return Refusal("reductions not all over the last axis of one shape, dims kept")
    else:
        shape = outputs[0].type.shape
    if not shape:
        return Refusal("a scalar has no rows")
    row_shape = shape[:-1] + (1,)
    if not _rowwise(nodes, reductions, shape, row_shape):
        return Refusal("an element downstream of a reduction leaves its row")
    if any(v.type.shape not in (shape, row_shape, shape[:-1]) and not same_rows(v.type.shape, shape) for v in outputs):
        return Refusal("an output is not of the row shape")
    return RowsMatch(tuple(reductions), shape)
