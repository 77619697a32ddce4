"""Convolution operand tiles of an implicit GEMM with positions as rows: ``c [positions x
channels] += im2col [positions x K] @ weights [K x channels]``.

The gemm+epilogue builder (``gemm_epilogue._Builder``) calls these for a Conv (ungrouped
or grouped, not channels-as-rows: ``conv_rows.py``) and a ConvTranspose. K runs over
(input channel, *taps); a K step holds whole channels, so a tile's channel comes from the
step number and its taps from loop variables, with no division, except where TileLang
takes only a nest over the step's K columns (1-D convolutions, K tiles padded to the MMA's
k16). Which channels a step holds, for a grouped convolution on a device with blocks, is
``group_k_step``'s answer.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Node
from tilefuse.ir.prims import Conv, ConvTranspose, ScalarFn
from tilefuse.tile_ir.ir import Buffer, Call, Const, Expr, IOp, Load, Region, Stmt, Store, Transpose, Var, const_index, iop
from tilefuse.tile_ir.lower import gemm_weights
from tilefuse.tile_ir.lower.common import narrow, parallel, widen
from tilefuse.tile_ir.lower.elements import (
    ElementBuilder,
    Index,
    delinearize,
    linearize,
    transposed_source,
    window_needs_guard,
    window_source,
)

if TYPE_CHECKING:
    from tilefuse.tile_ir.lower.gemm_epilogue import _Builder

Operand = Callable[[Expr, Expr], Expr]


def fills(b: "_Builder", el: ElementBuilder, ta: Buffer, tb: Buffer, row: Callable[[Expr], Expr],
          column: Callable[[Expr], Expr], kt: Var, chans: int, weights: bool = True) -> list[Stmt]:
    """im2col and weight tiles as loop nests over (channel, *taps): the K index is
    linearised from loop variables instead of divided back into them. ``row`` and
    ``column`` give the product's row and output channel of a tile row and column
    (clamped past a partial last tile, whose lanes recompute the last one). Channels
    count within a group: the weight's as they are, the input's from the tile's group's
    first (``in_channel0``). Without ``weights`` only the im2col tile (a host's weight
    is read from its panels, ``panels.conv_product``)."""
    c = b.c
    op: Conv = c.op  # type: ignore[assignment]  # the builder calls this for a Conv only
    x, w = c.inputs
    out = c.outputs[0].type.shape
    spatial, taps, cin = out[2:], w.type.shape[2:], w.type.shape[1]
    dt = b.acc_dtype
    bm, bn = ta.shape[0], tb.shape[1]
    ch0 = iop(IOp.MUL, kt, chans)
    guards = [
        window_needs_guard(out[2 + d], taps[d], op.strides[d], op.dilations[d], op.pads[d], x.type.shape[2 + d])
        for d in range(len(spatial))
    ]
    inner = b.positions_inner

    def a_value(i: Expr, cl: Expr, t: Index, conds: list[Expr]) -> Expr:
        """Tile row ``i``'s im2col value at channel ``cl`` of the step and taps ``t``;
        zero where a condition of ``conds`` or of the window fails."""
        n, *o = delinearize(row(i), (out[0], *spatial))
        ch = iop(IOp.ADD, ch0, cl)
        pos, inside = window_source(o, t, op.strides, op.dilations, op.pads, x.type.shape[2:], guards)
        conds = conds + ([iop(IOp.LT, ch, cin)] if cin % chans else []) + ([inside] if inside is not None else [])
        cond: Expr | None = None
        for c_ in conds:
            cond = c_ if cond is None else iop(IOp.AND, cond, c_)
        val = widen(el.at(x, (n, iop(IOp.ADD, b.in_channel0, ch), *pos)), dt)
        if cond is not None:
            val = Call(ScalarFn.WHERE, (cond, val, Const(0, dt)), dt)
        return narrow(val, ta.dtype)

    def b_value(cl: Expr, t: Index, j: Expr) -> Expr:
        ch = iop(IOp.ADD, ch0, cl)
        if b.packed is not None:
            kg = iop(IOp.ADD, iop(IOp.MUL, ch, math.prod(taps)), linearize(tuple(t), tuple(taps)))
            val = widen(Load(b.packed, (kg, column(j))), dt)
        else:
            val = widen(el.at(w, (column(j), ch, *t)), dt)
        if cin % chans:
            val = Call(ScalarFn.WHERE, (iop(IOp.LT, ch, cin), val, Const(0, dt)), dt)
        return narrow(val, tb.dtype)

    if b.k_steps is None and len(taps) > 1:
        def a_body(idx: Index) -> list[Stmt]:
            i, cl, t = (idx[-1], idx[0], idx[1:-1]) if inner else (idx[0], idx[1], idx[2:])
            return [Store(ta, (i, linearize((cl, *t), (chans, *taps))), a_value(i, cl, t, []))]

        def b_body(idx: Index) -> list[Stmt]:
            cl, t, j = idx[0], idx[1:-1], idx[-1]
            return [Store(tb, (linearize((cl, *t), (chans, *taps)), j), b_value(cl, t, j))]

        a_nest = (chans, *taps, bm) if inner else (bm, chans, *taps)
        return [*parallel(b.names, a_nest, a_body), *(parallel(b.names, (chans, *taps, bn), b_body) if weights else ())]
    # Nests over the tile's K columns, each column's channel and taps divided back out of
    # it: TileLang finds no layout for the nest over (channels, taps) of Whisper's kernel-3
    # Conv1d ("Mapped indices are not independent"), and takes this one. A K tile deeper
    # than its step (zero columns to the MMA's k16) zeroes A past the step's columns (0 x
    # whatever the tile held could be NaN, and TileLang's pipeline takes one write of a
    # tile per step); the packed weight has the zero rows, so its B tile is one rectangle.
    real, depth = b.k_steps or (chans * math.prod(taps),) * 2
    padded = b.k_steps is not None
    packed = b.packed

    def a_columns(ij: Index) -> list[Stmt]:
        k, i = ij if inner else (ij[1], ij[0])
        cl, *t = delinearize(k, (chans, *taps))
        return [Store(ta, (i, k), a_value(i, cl, tuple(t), [iop(IOp.LT, k, real)] if padded else []))]

    def b_columns(kj: Index) -> list[Stmt]:
        k, j = kj
        if padded:
            assert packed is not None  # a padded K tile is built only over a packed weight
            return [Store(tb, kj, Load(packed, (iop(IOp.ADD, iop(IOp.MUL, kt, depth), k), column(j))))]
        cl, *t = delinearize(k, (chans, *taps))
        return [Store(tb, kj, b_value(cl, tuple(t), j))]

    return [*parallel(b.names, (depth, bm) if inner else (bm, depth), a_columns),
            *(parallel(b.names, (depth, bn), b_columns) if weights else ())]


def turned_input(b: "_Builder", x_param: Buffer | None, ta: Buffer, mt: Var, kt: Var, chans: int) -> list[Stmt] | None:
    """A pointwise convolution's im2col tile as the input's channel planes turned over,
    where it is exactly that: 1 x 1 taps, unit strides, no padding, one group, float32
    tiles of whole images' positions, whole channel steps, the input a kernel input
    (``x_param``). The host's 16 x 16 block transpose then fills it, one ``Transpose`` an
    image, where the element nest read the input a channel plane's stride apart for every
    element (a 7 x 7 map's 256 channels a step: 5% of a 960 -> 160 projection's time by
    hand). None where it is not."""
    c = b.c
    op = c.op
    x = c.inputs[0]
    if (x_param is None or not isinstance(op, Conv) or b.groups != 1 or b.k_steps is not None
            or b.target.device.max_block_threads or not any(x is v for v in b.group.inputs)
            or any(t != 1 for t in c.inputs[1].type.shape[2:]) or any(s != 1 for s in op.strides) or any(op.pads)):
        return None
    plane = math.prod(x.type.shape[2:])
    rows = ta.shape[0]
    if ({ta.dtype, x.type.dtype, x_param.dtype} != {DType.FLOAT32} or ta.shape[1] != chans or rows % plane
            or b.m % rows or c.inputs[1].type.shape[1] % chans):
        return None
    per_tile = rows // plane  # images a tile holds
    first = iop(IOp.MUL, mt, per_tile) if b.m > rows else const_index(0)
    ch0, zeros = iop(IOp.MUL, kt, chans), (const_index(0),) * (x.type.rank - 2)
    src: Buffer = x_param

    def image(i: int) -> Stmt:
        n = iop(IOp.ADD, first, const_index(i)) if i else first
        return Transpose(Region(src, (n, ch0, *zeros), (1, chans, *x.type.shape[2:])),
                         Region(ta, (const_index(i * plane), const_index(0)), (plane, chans)))

    return [image(i) for i in range(per_tile)]


def transposed_operands(b: "_Builder", el: ElementBuilder, c: Node) -> tuple[Operand, Operand]:
    """A transposed convolution's (a_elem, b_elem) in gather form: output position o takes
    input position (o + pad - tap * dilation) / stride where that divides exactly and is
    in range. Grouped, K runs over one group's input channels, from the tile's group's
    first (``in_channel0``), and output channel ``col`` is channel ``col % (M / groups)``
    of the group's weight."""
    dt = b.acc_dtype
    x, w = c.inputs
    op: ConvTranspose = c.op  # type: ignore[assignment]  # the builder calls this for a ConvTranspose only
    out = c.outputs[0].type.shape
    spatial, taps, cin, per_group = out[2:], w.type.shape[2:], w.type.shape[0] // op.groups, w.type.shape[1]

    def a_elem(r: Expr, k: Expr) -> Expr:
        n, *o = delinearize(r, (out[0], *spatial))
        ch, *t = delinearize(k, (cin, *taps))
        pos, cond = transposed_source(o, t, op.strides, op.dilations, op.pads, x.type.shape[2:])
        val = widen(el.at(x, (n, iop(IOp.ADD, b.in_channel0, ch), *pos)), dt)
        return Call(ScalarFn.WHERE, (cond, val, Const(0, dt)), dt)

    def b_elem(k: Expr, col: Expr) -> Expr:
        ch, *t = delinearize(k, (cin, *taps))
        channel = iop(IOp.MOD, col, per_group) if op.groups > 1 else col
        return widen(el.at(w, (iop(IOp.ADD, b.in_channel0, ch), channel, *t)), dt)

    return a_elem, b_elem


def group_k_step(b: "_Builder", cin: int, taps: int, bm: int, bn: int, chans: int) -> tuple[int, bool]:
    """Input channels per K step of a grouped convolution on a device with blocks, and
    whether its K tile is padded with zero columns to the MMA's k16 (as a stem's is).
    A group's few output channels make a short weight tile nest (channels x taps x
    columns) that thread fitting can split over few threads only (it halves a block
    until every nest at least as long divides): ResNeXt's 4 x 9 x 4 = 144 elements
    left 16 threads, 8 channels' 4 x 9 x 8 left 32. Of the divisors of ``cin`` up to
    ``chans``, each unpadded or padded (where the padded tiles can be built), the
    one that keeps the most threads; then one whose K tile the matrix unit takes
    (half operands, or TF32), the fewest K columns in all (steps x depth), the most
    channels."""
    asked = b.asked_threads(bm, bn)
    can_pad = b.mma_rows > 1 and gemm_weights.packs_conv_weight(b)
    mma_k = 16 if b.op_dtype.itemsize == 2 else 8 if b.tf32 else 0

    def score(step: tuple[int, bool]) -> tuple[int, bool, int, int]:
        ch, padded = step
        depth = -(-ch * taps // 16) * 16 if padded else ch * taps
        t = asked
        while t > 1 and any(n >= t and n % t for n in (depth * bm, depth * bn)):
            t //= 2
        return t, bool(mma_k) and bn % 16 == 0 and depth % mma_k == 0, -(cin // ch) * depth, ch

    steps = [(d, padded) for d in range(1, chans + 1) if cin % d == 0
             for padded in ((False, True) if can_pad and d * taps % 16 else (False,))]
    return max(steps, key=score)
