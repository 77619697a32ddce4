"""Element expressions: the value of any in-group tensor at an index, as a tile-IR Expr.

Index primitives become address arithmetic here: a Transpose permutes the index, a
Reshape re-linearises it, a Concat or Pad selects between sources, a Gather loads its
index first (checked, when it is read at run time: lower/checks.py). Maps become Calls. Values that are materialised (group inputs, staged
results such as reductions) are Loads from their buffers.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import (
    Broadcast,
    Concat,
    Gather,
    GatherElements,
    GatherND,
    Map,
    Pad,
    PadMode,
    Reshape,
    ScalarFn,
    Slice,
    Transpose,
)
from tilefuse.tile_ir.ir import Buffer, Call, Const, Expr, IOp, Load, const_index, iop
from tilefuse.tile_ir.lower.checks import IndexSites

Index = tuple[Expr, ...]


class Unmaterialised(Exception):
    """A value the element builder cannot inline (a reduction, a contraction, a scatter)."""


def broadcast_index(idx: Index, src_shape: Sequence[int], out_shape: Sequence[int]) -> Index:
    """The index into a numpy-broadcast operand for an index into the result."""
    lead = len(out_shape) - len(src_shape)
    return tuple(const_index(0) if d == 1 else idx[lead + k] for k, d in enumerate(src_shape))


def linearize(idx: Index, shape: Sequence[int]) -> Expr:
    out: Expr = const_index(0)
    for i, d in zip(idx, shape):
        out = iop(IOp.ADD, iop(IOp.MUL, out, d), i)
    return out


def delinearize(flat: Expr, shape: Sequence[int]) -> Index:
    out = []
    stride = math.prod(shape)
    for d in shape:
        stride //= max(d, 1) if d else 1
        out.append(iop(IOp.MOD, iop(IOp.FLOORDIV, flat, stride or 1), d) if d != 1 else const_index(0))
    return tuple(out)


def reshape_index(idx: Index, out_shape: Sequence[int], in_shape: Sequence[int]) -> Index:
    """Map an index of the reshaped tensor to the source, block by block of equal size
    so that pure splits, merges and unit dims need little division."""
    result: list[Expr] = []
    i = j = 0
    while i < len(out_shape) or j < len(in_shape):
        oi, oj = i, j
        po = pi = 1
        if i < len(out_shape):
            po *= out_shape[i]
            i += 1
        if j < len(in_shape):
            pi *= in_shape[j]
            j += 1
        while po != pi:
            if po < pi and i < len(out_shape):
                po *= out_shape[i]
                i += 1
            elif j < len(in_shape):
                pi *= in_shape[j]
                j += 1
            else:
                break
        flat = linearize(idx[oi:i], out_shape[oi:i])
        result += delinearize(flat, in_shape[oj:j])
    return tuple(result)


def index_of(e: Expr, dtype: DType) -> Expr:
    """An index value of an integer dtype, as the int64 that addressing uses."""
    return e if dtype is DType.INT64 else Call(ScalarFn.CAST, (e,), DType.INT64)


def wrap_negative(i: Expr, n: int) -> Expr:
    """ONNX indices may be negative: i < 0 ? i + n : i."""
    return Call(ScalarFn.WHERE, (iop(IOp.LT, i, 0), iop(IOp.ADD, i, n), i), DType.INT64)


def index_position(sites: IndexSites, node: Node, coordinate: int, index: Expr, dtype: DType, n: int) -> Expr:
    """Where index ``index`` (of integer ``dtype``) of ``node`` points on an axis of ``n``:
    checked when the indices are read at run time, else (constants, checked when the
    group was lowered) wrapped."""
    i = index_of(index, dtype)
    checked = sites.check(node, coordinate, i, n)
    return checked if checked is not None else wrap_negative(i, n)


class ElementBuilder:
    """Builds ``value[index]`` expressions for the values of one group."""

    def __init__(self, buffers: dict[int, Buffer], read: Callable[[Value, Index], Expr] | None,
                 sites: IndexSites) -> None:
        self.buffers = buffers  # id(value) -> buffer holding it (inputs, staged results)
        self.read = read  # how to read a staged value (lets a stage hold a cast of an accumulator)
        self.sites = sites  # the group's index checks
        self.memo: dict[tuple[int, Index], Expr] = {}

    def at(self, v: Value, idx: Index) -> Expr:
        key = (id(v), idx)
        if key not in self.memo:
            self.memo[key] = self._at(v, idx)
        return self.memo[key]

    def _at(self, v: Value, idx: Index) -> Expr:
        if v.is_constant and v.type.size == 1:
            return Const(v.data.reshape(()).item(), v.type.dtype)  # type: ignore[union-attr]
        if id(v) in self.buffers:
            if self.read is not None:
                return self.read(v, idx)
            return Load(self.buffers[id(v)], idx)
        node = v.producer
        if node is None:
            raise Unmaterialised(f"{v.name} has no buffer")
        rule = _RULES.get(type(node.op))
        if rule is None:
            raise Unmaterialised(f"{node.op} must be staged")
        return rule(self, node, v, idx)


def _map(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    op: Map = n.op  # type: ignore[assignment]
    args = tuple(b.at(u, broadcast_index(idx, u.type.shape, v.type.shape)) for u in n.inputs)
    return Call(op.fn, args, v.type.dtype)


def _transpose(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    perm = n.op.perm  # type: ignore[attr-defined]
    src: list[Expr] = [const_index(0)] * len(perm)
    for k, p in enumerate(perm):
        src[p] = idx[k]
    return b.at(n.inputs[0], tuple(src))


def _reshape(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    return b.at(n.inputs[0], reshape_index(idx, v.type.shape, n.inputs[0].type.shape))


def _broadcast(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    return b.at(n.inputs[0], broadcast_index(idx, n.inputs[0].type.shape, v.type.shape))


def _slice(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    op: Slice = n.op  # type: ignore[assignment]
    return b.at(n.inputs[0], tuple(iop(IOp.ADD, s, iop(IOp.MUL, i, st)) for i, s, st in zip(idx, op.starts, op.steps)))


def _concat(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    axis = n.op.axis  # type: ignore[attr-defined]
    offsets, total = [], 0
    for u in n.inputs:
        offsets.append(total)
        total += u.type.shape[axis]
    # Nest from the last piece back: idx < end_of_piece_k ? piece_k : (later pieces).
    expr: Expr | None = None
    for u, off in reversed(list(zip(n.inputs, offsets))):
        if u.type.shape[axis] == 0:
            continue
        sub = list(idx)
        sub[axis] = iop(IOp.SUB, idx[axis], off)
        piece = b.at(u, tuple(sub))
        end = off + u.type.shape[axis]
        expr = piece if expr is None else Call(ScalarFn.WHERE, (iop(IOp.LT, idx[axis], end), piece, expr), v.type.dtype)
    assert expr is not None
    return expr


def _pad(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    op: Pad = n.op  # type: ignore[assignment]
    shape = n.inputs[0].type.shape
    r = len(shape)
    inner = [iop(IOp.SUB, i, op.pads[k]) for k, i in enumerate(idx)]
    if op.mode is PadMode.CONSTANT:
        cond: Expr | None = None
        for k, i in enumerate(inner):
            if op.pads[k] == 0 and op.pads[k + r] == 0:
                continue
            ok = iop(IOp.AND, iop(IOp.GE, i, 0), iop(IOp.LT, i, shape[k]))
            cond = ok if cond is None else iop(IOp.AND, cond, ok)
        load = b.at(n.inputs[0], tuple(inner))
        if cond is None:
            return load
        return Call(ScalarFn.WHERE, (cond, load, Const(op.value, v.type.dtype)), v.type.dtype)
    src = []
    for i, d in zip(inner, shape):
        if op.mode is PadMode.EDGE:
            src.append(iop(IOp.MIN, iop(IOp.MAX, i, 0), d - 1))
        elif op.mode is PadMode.WRAP:
            src.append(iop(IOp.MOD, i, d))
        else:  # reflect: |(d-1) - |i|| mirrored back into [0, d)
            a = iop(IOp.MAX, i, iop(IOp.SUB, 0, i))
            m = iop(IOp.SUB, d - 1, a)
            src.append(iop(IOp.SUB, d - 1, iop(IOp.MAX, m, iop(IOp.SUB, 0, m))))
    return b.at(n.inputs[0], tuple(src))


def _gather(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    axis = n.op.axis  # type: ignore[attr-defined]
    data, ind = n.inputs
    r = ind.type.rank
    i = index_position(b.sites, n, 0, b.at(ind, idx[axis : axis + r]), ind.type.dtype, data.type.shape[axis])
    return b.at(data, idx[:axis] + (i,) + idx[axis + r :])


def _gather_elements(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    axis = n.op.axis  # type: ignore[attr-defined]
    data, ind = n.inputs
    src = list(idx)
    src[axis] = index_position(b.sites, n, 0, b.at(ind, idx), ind.type.dtype, data.type.shape[axis])
    return b.at(data, tuple(src))


def _gather_nd(b: ElementBuilder, n: Node, v: Value, idx: Index) -> Expr:
    bd = n.op.batch_dims  # type: ignore[attr-defined]
    data, ind = n.inputs
    last = ind.type.shape[-1]
    prefix = idx[: ind.type.rank - 1]
    coords = [
        index_position(b.sites, n, j, b.at(ind, prefix + (const_index(j),)), ind.type.dtype, data.type.shape[bd + j])
        for j in range(last)
    ]
    return b.at(data, idx[:bd] + tuple(coords) + idx[ind.type.rank - 1 :])


_RULES = {
    Map: _map,
    Transpose: _transpose,
    Reshape: _reshape,
    Broadcast: _broadcast,
    Slice: _slice,
    Concat: _concat,
    Pad: _pad,
    Gather: _gather,
    GatherElements: _gather_elements,
    GatherND: _gather_nd,
}


def window_source(
    out_idx: Sequence[Expr], tap_idx: Sequence[Expr], strides: Sequence[int], dilations: Sequence[int], pads: Sequence[int],
    in_sizes: Sequence[int], guard: Sequence[bool] | None = None,
) -> tuple[list[Expr], Expr | None]:
    """Input positions ``o * stride + t * dilation - pad`` of a sliding window (convolution,
    pooling), and the condition that they are inside the input — for the dims ``guard``
    marks (all by default); None when no dim needs one."""
    pos: list[Expr] = []
    cond: Expr | None = None
    for d, (o, t) in enumerate(zip(out_idx, tap_idx)):
        p = iop(IOp.SUB, iop(IOp.ADD, iop(IOp.MUL, o, strides[d]), iop(IOp.MUL, t, dilations[d])), pads[d])
        pos.append(p)
        if guard is None or guard[d]:
            ok = iop(IOp.AND, iop(IOp.GE, p, 0), iop(IOp.LT, p, in_sizes[d]))
            cond = ok if cond is None else iop(IOp.AND, cond, ok)
    return pos, cond


def window_needs_guard(out_size: int, taps: int, stride: int, dilation: int, pad: int, in_size: int) -> bool:
    """Whether some window position of this dim falls outside the input."""
    return pad > 0 or (out_size - 1) * stride + (taps - 1) * dilation - pad >= in_size


def transposed_source(
    out_idx: Sequence[Expr], tap_idx: Sequence[Expr], strides: Sequence[int], dilations: Sequence[int], pads: Sequence[int],
    in_sizes: Sequence[int],
) -> tuple[list[Expr], Expr]:
    """A transposed convolution in gather form: output position o reads input position
    ``(o + pad - t * dilation) / stride`` where that divides exactly and is in range."""
    pos: list[Expr] = []
    cond: Expr | None = None
    for d, (o, t) in enumerate(zip(out_idx, tap_idx)):
        num = iop(IOp.SUB, iop(IOp.ADD, o, pads[d]), iop(IOp.MUL, t, dilations[d]))
        i = iop(IOp.FLOORDIV, num, strides[d])
        ok = iop(IOp.AND, iop(IOp.AND, iop(IOp.GE, num, 0), iop(IOp.EQ, iop(IOp.MOD, num, strides[d]), 0)),
                 iop(IOp.LT, i, in_sizes[d]))
        pos.append(i)
        cond = ok if cond is None else iop(IOp.AND, cond, ok)
    assert cond is not None
    return pos, cond
