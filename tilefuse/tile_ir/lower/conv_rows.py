"""Convolution tiles with output channels as rows: ``c [channels x positions] += weights
[channels x K] @ im2col^T [K x positions]`` (``Target.conv_channel_rows``).

The gemm+epilogue builder (``gemm_epilogue._Builder``) calls these for a Conv (ungrouped,
grouped or depthwise) when its target asks for it. A position tile is a block of whole
output rows of one image (``bm = rows x prod(spatial[1:])``), so nothing inside a tile
divides: the tile's image and first row come from the tile number once, and every loop
runs over (row, column...). In an NCHW layout this puts the unit stride where it pays:
im2col^T rows are runs of input rows, the weight tile is rows of the weight as stored, and
outputs are stored along positions.
"""
from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from tilefuse import cpu_isa
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Conv, ScalarFn
from tilefuse.tile_ir.ir import (Buffer, Call, Const, Expr, If, IOp, LaneTaps, Load, PlaneTaps, Region, Scope, Stmt, Store, StridedGemm,
                                 TapGemm, Transpose, Var, const_index, iop)
from tilefuse.tile_ir.lower import gemm_weights
from tilefuse.tile_ir.lower.common import narrow, parallel, serial, widen
from tilefuse.tile_ir.lower.elements import ElementBuilder, Index, linearize, window_needs_guard, window_source

if TYPE_CHECKING:
    from tilefuse.tile_ir.lower.gemm_epilogue import _Builder


def origin(b: "_Builder", mt: Var, rows: int) -> tuple[Expr, Expr]:
    """The image and first output row of position tile ``mt``."""
    blocks = b.c.outputs[0].type.shape[2] // rows
    if blocks == 1:
        return mt, const_index(0)
    return iop(IOp.FLOORDIV, mt, blocks), iop(IOp.MUL, iop(IOp.MOD, mt, blocks), rows)


def _tile_shape(b: "_Builder", bm: int) -> tuple[int, ...]:
    """A position tile of ``bm`` positions as (rows, *spatial[1:])."""
    spatial = b.c.outputs[0].type.shape[2:]
    inner = math.prod(spatial[1:])
    return (bm // inner, *spatial[1:])


def in_place(b: "_Builder", bn: int) -> bool:
    """A pointwise convolution (1 x 1 taps, unit strides, no padding, one group) in
    float32 on a host with the product core (``GemmPolicy.panel_width``), whose weight is
    bound as [Cout, K] rows and whose input is a kernel input:
    its im2col^T tile would be a copy of the input's channel planes and its weight tile a
    copy of the weight's rows, so the product reads both where they lie
    (``in_place_product``). Whole column tiles only (rows past Cout are not read)."""
    op = b.c.op
    x = b.c.inputs[0]
    return (isinstance(op, Conv) and b.flip and not b.depthwise and b.groups == 1 and b.target.gemm.panel_width > 0
            and gemm_weights.packs_conv_rows(b)  # (a host's: no blocks)
            and all(t == 1 for t in b.c.inputs[1].type.shape[2:]) and all(s == 1 for s in op.strides)
            and not any(op.pads) and {b.acc_dtype, b.op_dtype, x.type.dtype} == {DType.FLOAT32}
            and any(x is v for v in b.group.inputs) and b.n % bn == 0)


def in_place_product(b: "_Builder", x_param: Buffer, tc: Buffer, mt: Var, n0: Expr, kt: Var, chans: int) -> Stmt:
    """K step ``kt`` of a pointwise convolution (``in_place``): the tile's rows of the
    bound weight, ``chans`` input channels of them, by those channels' planes of the
    tile's output rows (a run of ``rows x W`` positions each, rows ``H x W`` apart)."""
    assert b.packed is not None
    bn, bm = tc.shape
    shape = _tile_shape(b, bm)
    img, row0 = origin(b, mt, shape[0])
    ch0 = iop(IOp.MUL, kt, chans)
    spatial = x_param.shape[2:]
    a = Region(b.packed, (n0, ch0), (bn, chans))
    planes = Region(x_param, (img, ch0, row0, *(const_index(0) for _ in spatial[1:])), (1, chans, *shape))
    return StridedGemm(a, planes, 1, tc, a_blocks=b.row_blocks)


def fills(b: "_Builder", el: ElementBuilder, ta: Buffer, tb: Buffer, mt: Var, n0: Expr, kt: Var, chans: int) -> list[Stmt]:
    """The weight tile [channels, (chan, *taps)] and the im2col^T tile [(chan, *taps), positions]
    for K tile ``kt`` (``chans`` whole input channels; of a grouped convolution, channels of
    the tile's group, which starts at input channel ``b.in_channel0``)."""
    c = b.c
    op: Conv = c.op  # type: ignore[assignment]
    x, w = c.inputs
    out = c.outputs[0].type.shape
    spatial, taps, cin = out[2:], w.type.shape[2:], w.type.shape[1]
    dt = b.acc_dtype
    shape = _tile_shape(b, tb.shape[1])
    img, row0 = origin(b, mt, shape[0])
    ch0 = iop(IOp.MUL, kt, chans)
    guards = [
        window_needs_guard(out[2 + d], taps[d], op.strides[d], op.dilations[d], op.pads[d], x.type.shape[2 + d])
        for d in range(len(spatial))
    ]

    def chan_ok(ch: Expr) -> list[Expr]:
        return [iop(IOp.LT, ch, cin)] if cin % chans else []

    def w_body(idx: Index) -> list[Stmt]:
        j, cl, t = idx[0], idx[1], idx[2:]
        ch = iop(IOp.ADD, ch0, cl)
        val = widen(el.at(w, (iop(IOp.ADD, n0, j), ch, *t)), dt)
        for cond in chan_ok(ch):
            val = Call(ScalarFn.WHERE, (cond, val, Const(0, dt)), dt)
        return [Store(ta, (j, linearize((cl, *t), (chans, *taps))), narrow(val, ta.dtype))]

    per_k = chans * math.prod(taps)

    def w_rows(idx: Index) -> list[Stmt]:  # the weight bound [Cout, K]: a run of K per channel
        j, q = idx
        col = iop(IOp.ADD, iop(IOp.MUL, kt, per_k), q)
        val = widen(Load(b.packed, (iop(IOp.ADD, n0, j), col)), dt)  # type: ignore[arg-type]
        if cin % chans:
            val = Call(ScalarFn.WHERE, (iop(IOp.LT, col, cin * math.prod(taps)), val, Const(0, dt)), dt)
        return [Store(ta, (j, q), narrow(val, ta.dtype))]

    def x_value(cl: Expr, t: Index, p: Index, guard: list[bool]) -> Expr:
        ch = iop(IOp.ADD, ch0, cl)
        o = (iop(IOp.ADD, row0, p[0]), *p[1:])
        pos, inside = window_source(o, t, op.strides, op.dilations, op.pads, x.type.shape[2:], guard)
        conds = chan_ok(ch) + ([inside] if inside is not None else [])
        val = widen(el.at(x, (img, iop(IOp.ADD, b.in_channel0, ch), *pos)), dt)
        if conds:
            cond = conds[0]
            for more in conds[1:]:
                cond = iop(IOp.AND, cond, more)
            val = Call(ScalarFn.WHERE, (cond, val, Const(0, dt)), dt)
        return narrow(val, tb.dtype)

    def put(cl: Expr, t: Index, p: Index, val: Expr) -> list[Stmt]:
        return [Store(tb, (linearize((cl, *t), (chans, *taps)), linearize(p, shape)), val)]

    x_fill = _split_last(b, mt, taps, shape, guards, x.type.shape[-1], op, x_value, put, chans)
    if b.packed is not None and gemm_weights.packs_conv_rows(b):
        return [*parallel(b.names, (ta.shape[0], per_k), w_rows), *x_fill]
    return [*parallel(b.names, (ta.shape[0], chans, *taps), w_body), *x_fill]


Runs = tuple[tuple[int, int], ...]  # per last-dim tap, the tile positions [lo, hi) inside the input


def _tap_runs(b: "_Builder", mt: Var, shape: tuple[int, ...], op: Conv, taps_last: int,
              in_last: int) -> list[tuple[Expr | None, Runs]]:
    """For each last-dim tap, the run [lo, hi) of a tile's positions (its own coordinates)
    whose input position is inside the input; by groups of consecutive tiles that share
    them, each with the condition on the tile number that selects it (None: every tile).
    Where the tile holds whole rows the last dim starts at 0 in every tile; along a 1-D
    convolution's positions a tile is a block of the last dim itself, and the runs depend
    on where it starts: the tiles the padding reaches get their own, the rest read every
    tap unchecked."""
    stride, dil, pad = op.strides[-1], op.dilations[-1], op.pads[len(op.strides) - 1]
    n = shape[-1]
    blocks = b.c.outputs[0].type.shape[-1] // n if len(shape) == 1 else 1

    def runs_from(first: int) -> Runs:
        runs = []
        for tl in range(taps_last):
            # o * stride + tl * dil - pad in [0, in_last)  <=>  lo <= o < hi (o the output position)
            lo = max(0, -(-(pad - tl * dil) // stride))
            hi = (in_last - 1 + pad - tl * dil) // stride + 1
            lo_t = min(n, max(0, lo - first))
            runs.append((lo_t, max(lo_t, min(n, hi - first))))
        return tuple(runs)

    tile = iop(IOp.MOD, mt, blocks)  # the tile's block within its image, as origin counts it
    out: list[tuple[Expr | None, Runs]] = []
    first = 0
    for runs, same in itertools.groupby(runs_from(t * n) for t in range(blocks)):
        end = first + len(list(same))
        conds = ([iop(IOp.GE, tile, first)] if first > 0 else []) + ([iop(IOp.LT, tile, end)] if end < blocks else [])
        out.append((None if not conds else conds[0] if len(conds) == 1 else iop(IOp.AND, *conds), runs))
        first = end
    return out


def _split_last(b: "_Builder", mt: Var, taps, shape, guards, in_last: int, op: Conv, value, put, chans: int) -> list[Stmt]:
    """The im2col^T nest over (chan, *taps, *positions). Where the last dim needs a bounds
    check, each of its taps is a nest of its own whose positions split into a zero head, an
    unchecked middle and a zero tail (constant bounds per tap and group of tiles,
    ``_tap_runs``): the innermost loop then copies a run of an input row, and no
    per-element test is left to vectorise."""
    k = len(taps)
    if not guards[-1] or shape[-1] < 2:
        return list(parallel(b.names, (chans, *taps, *shape), lambda i: put(i[0], i[1:1 + k], i[1 + k:],
                                                                           value(i[0], i[1:1 + k], i[1 + k:], guards))))
    n = shape[-1]
    inner_guards = [*guards[:-1], False]
    zero = narrow(Const(0, b.acc_dtype), b.op_dtype)
    out: list[Stmt] = []
    for cond, runs in _tap_runs(b, mt, shape, op, taps[-1], in_last):
        nests: list[Stmt] = []
        for tl, (lo, hi) in enumerate(runs):
            t_last = const_index(tl)
            for start, size, inside in ((0, lo, False), (lo, hi - lo, True), (hi, n - hi, False)):
                if size <= 0:
                    continue

                def body(i: Index, start: int = start, inside: bool = inside, t_last: Expr = t_last) -> list[Stmt]:
                    cl, t = i[0], (*i[1:k], t_last)
                    p = (*i[k:-1], iop(IOp.ADD, i[-1], start) if start else i[-1])
                    return put(cl, t, p, value(cl, t, p, inner_guards) if inside else zero)

                nests += parallel(b.names, (chans, *taps[:-1], *shape[:-1], size), body)
        out += nests if cond is None else [If(cond, tuple(nests))]
    return out


def stores(b: "_Builder", el: ElementBuilder, v: Value, ob: Buffer, mt: Var, n0: Expr, bn: int, bm: int,
           pitch: int = 0) -> tuple[Stmt, ...]:
    """Output ``v`` of the group for this tile, looping over (channel, row, columns...) so
    that NCHW stores run along positions. The product index of each element is recorded
    with its tile position, so the epilogue's read of the product is a plain tile load.
    With ``pitch``, the product tile holds a 2-D tile's output rows that far apart
    (``direct_product``, ``depthwise_padded``)."""
    shape = _tile_shape(b, bm)
    img, row0 = origin(b, mt, shape[0])
    if pitch:
        def at_pitch(idx: Index) -> list[Stmt]:
            j, r, col = idx
            g = (img, iop(IOp.ADD, n0, j), iop(IOp.ADD, row0, r), col)
            b._tile_at[g] = (j, iop(IOp.ADD, iop(IOp.MUL, r, const_index(pitch)), col))
            out_idx = b.fwd[id(v)](g)
            return [Store(ob, out_idx, el.at(v, out_idx))]

        return parallel(b.names, (bn, *shape), at_pitch)
    # on a host, a channel's positions as one run (its rows are one run of the NCHW plane):
    # the printer cancels (q // W, q % W) in the flat offset (codegen/cpu/flat_access.py),
    # and the loop vectorises along whole rows, not along runs of W (14 floats: masked)
    runs = not b.target.device.max_block_threads and len(shape) > 1

    def store(idx: Index) -> list[Stmt]:
        j, p = idx[0], (delinearize(idx[1], shape) if runs else idx[1:])
        g = (img, iop(IOp.ADD, n0, j), iop(IOp.ADD, row0, p[0]), *p[1:])
        b._tile_at[g] = (j, idx[1] if runs else linearize(p, shape))
        out_idx = b.fwd[id(v)](g)
        return [Store(ob, out_idx, el.at(v, out_idx))]

    return parallel(b.names, (bn, bm) if runs else (bn, *shape), store)


def delinearize(q: Expr, shape: tuple[int, ...]) -> Index:
    """Position ``q`` of a row-major tile of ``shape`` as its index per dim."""
    out: list[Expr] = []
    for n in reversed(shape[1:]):
        out.append(iop(IOp.MOD, q, n))
        q = iop(IOp.FLOORDIV, q, n)
    return (q, *reversed(out))


def depthwise(b: "_Builder", el: ElementBuilder, tc: Buffer, mt: Var, n0: Expr) -> list[Stmt]:
    """``c[j, p] += w[j, tap] * x[j, window(p, tap)]`` for each tap in turn (taps unrolled, so
    that the positions whose window leaves the input along the last dim are simply not
    visited: constant bounds per tap, and the innermost loop runs along an input row).
    On a GPU every tap visits the whole row, its window checked along the last dim too:
    runs of their own lengths (27 of a 28-wide row) make nests a block's threads do not
    divide, and thread fitting narrows the block for them (rows shorter than twice the
    kernel's width made runs too short for TileLang's parallel-loop layouts: 3 of a 5-wide
    map)."""
    c = b.c
    op: Conv = c.op  # type: ignore[assignment]
    x, w = c.inputs
    out = c.outputs[0].type.shape
    spatial, taps = out[2:], w.type.shape[2:]
    dt = b.acc_dtype
    shape = _tile_shape(b, tc.shape[1])
    img, row0 = origin(b, mt, shape[0])
    guards = [
        window_needs_guard(out[2 + d], taps[d], op.strides[d], op.dilations[d], op.pads[d], x.type.shape[2 + d])
        for d in range(len(spatial))
    ]
    in_shape = x.type.shape[2:]
    if not b.target.device.max_block_threads:
        inner_guards = [*guards[:-1], False]
        tap_runs = _tap_runs(b, mt, shape, op, taps[-1], in_shape[-1])
    else:  # rows too short for runs TileLang lays out: every tap over the whole row, guarded
        inner_guards = guards
        tap_runs = [(None, tuple((0, shape[-1]) for _ in range(taps[-1])))]
    out_stmts: list[Stmt] = []
    for cond, runs in tap_runs:
        nests: list[Stmt] = []
        for tap in itertools.product(*(range(t) for t in taps)):
            lo, hi = runs[tap[-1]]
            if hi <= lo:
                continue
            t = tuple(const_index(v) for v in tap)

            def body(i: Index, t: Index = t, lo: int = lo) -> list[Stmt]:
                j, p = i[0], (*i[1:-1], iop(IOp.ADD, i[-1], lo) if lo else i[-1])
                ch = iop(IOp.ADD, n0, j)
                o = (iop(IOp.ADD, row0, p[0]), *p[1:])
                pos, inside = window_source(o, t, op.strides, op.dilations, op.pads, in_shape, inner_guards)
                term: Expr = Call(ScalarFn.MUL, (widen(el.at(x, (img, ch, *pos)), dt), widen(el.at(w, (ch, const_index(0), *t)), dt)), dt)
                if inside is not None:
                    term = Call(ScalarFn.WHERE, (inside, term, Const(0, dt)), dt)
                at = (j, linearize(p, shape))
                return [Store(tc, at, Call(ScalarFn.ADD, (Load(tc, at), term), dt))]

            nests += parallel(b.names, (tc.shape[0], *shape[:-1], hi - lo), body)
        if nests:
            out_stmts += nests if cond is None else [If(cond, tuple(nests))]
    return out_stmts


def padded_width(b: "_Builder") -> int:
    """The width of the zero-padded input rows ``depthwise_padded`` computes from (of each
    column phase of a strided one), or 0 where the target does not ask for it or the
    convolution is not a 2-D one."""
    op: Conv = b.c.op  # type: ignore[assignment]
    if not b.target.conv.depthwise_run or b.target.device.max_block_threads or len(op.strides) != 2:
        return 0
    return _phase_width(b)


def _phase_width(b: "_Builder") -> int:
    """The width of a 2-D convolution's zero-padded input rows over its column stride."""
    op: Conv = b.c.op  # type: ignore[assignment]
    return -(-(op.pads[1] + b.c.inputs[0].type.shape[3] + op.pads[3]) // op.strides[1])


class _Padded:
    """Where a tile's input rows lie when copied zero-padded on chip, split by stride phase:
    padded input (row, col) of a channel goes to plane ``(row % sy, col % sx)`` at
    ``(row // sy) * wc + col // sx`` (``wc``: the padded width over ``sx``; one plane at
    stride 1). Output (r, c) at tap (ty, tx) then reads plane ``(ty*dy % sy, tx*dx % sx)``
    at ``(r + ty*dy // sy) * wc + c + tx*dx // sx``: over the flat index ``q = r * wc + c``
    every tap reads at a constant offset from ``q``, and the ``wc - width`` columns past
    each output row are computed and dropped. A plane holds the rows the tile reads and what
    sums over ``length`` positions from each tap's offset read past them (zeros, into
    dropped columns); a channel's planes lie ``per_channel`` apart, with ``spread`` an odd
    number of cache lines (64 bytes), so that a product's K rows, one or a few a channel,
    fall in every set of the first-level cache (rows a power-of-two multiple of lines apart
    share a few sets and leave the cache before the next block of rows reads them again)."""

    def __init__(self, b: "_Builder", rows: int, length: int, spread: bool = False) -> None:
        op: Conv = b.c.op  # type: ignore[assignment]
        (kh, kw), (dy, dx), (sy, sx) = b.c.inputs[1].type.shape[2:], op.dilations, op.strides
        self.wc = _phase_width(b)
        self.taps = list(itertools.product(range(kh), range(kw)))
        # per tap: its plane and its offset inside the plane
        self.at_tap = [(((ty * dy) % sy) * sx + (tx * dx) % sx, ((ty * dy) // sy) * self.wc + (tx * dx) // sx)
                       for ty, tx in self.taps]
        self.rows_ph = -(-((rows - 1) * sy + (kh - 1) * dy + 1) // sy)  # padded input rows a tile reads, per row phase
        self.plane = max(self.rows_ph * self.wc, length + max(off for _, off in self.at_tap))
        self.per_channel = sy * sx * self.plane
        if spread:
            lines = -(-self.per_channel // 16)
            self.per_channel = (lines + 1 - lines % 2) * 16

    def offset(self, tap: int) -> int:
        """Where tap ``tap``'s run starts within a channel's planes."""
        plane, off = self.at_tap[tap]
        return plane * self.plane + off


def _padded_copy(b: "_Builder", el: ElementBuilder, x_pad: Buffer, geo: _Padded, mt: Var, rows: int, channel) -> list[Stmt]:
    """The tile's input rows of each of its channels (input channel ``channel(j)`` for row
    ``j`` of ``x_pad``, ``geo.per_channel`` long) copied into their phase planes, and what
    the copy leaves of each plane (padding columns, a tail past its rows) zeroed."""
    c = b.c
    op: Conv = c.op  # type: ignore[assignment]
    x = c.inputs[0]
    (sy, sx) = op.strides
    in_h, in_w = x.type.shape[2:]
    top, left = op.pads[0], op.pads[1]
    dt = b.acc_dtype
    img, row0 = origin(b, mt, rows)
    wc, rows_ph = geo.wc, geo.rows_ph
    last_src = (c.outputs[0].type.shape[2] - rows) * sy - top + rows_ph * sy - 1  # the last tile's last row read
    row_guard = top > 0 or last_src >= in_h

    def copy(py: int, px: int, c_lo: int):
        def body(i: Index) -> list[Stmt]:
            j, rp, cp = i
            src_row = iop(IOp.ADD, iop(IOp.MUL, row0, const_index(sy)) if sy > 1 else row0,
                          iop(IOp.ADD, iop(IOp.MUL, rp, const_index(sy)) if sy > 1 else rp, const_index(py - top)))
            src_col = iop(IOp.ADD, iop(IOp.MUL, cp, const_index(sx)) if sx > 1 else cp, const_index(c_lo * sx + px - left))
            val = widen(el.at(x, (img, channel(j), src_row, src_col)), dt)
            if row_guard:
                inside = iop(IOp.AND, iop(IOp.GE, src_row, const_index(0)), iop(IOp.LT, src_row, const_index(in_h)))
                val = Call(ScalarFn.WHERE, (inside, val, Const(0, dt)), dt)
            at = iop(IOp.ADD, iop(IOp.MUL, rp, const_index(wc)), iop(IOp.ADD, cp, const_index((py * sx + px) * geo.plane + c_lo)))
            return [Store(x_pad, (j, at), val)]
        return body

    def zero(start: int, row_pitch: int):
        def body(i: Index) -> list[Stmt]:
            j, rp, cp = i
            at = iop(IOp.ADD, iop(IOp.MUL, rp, const_index(row_pitch)), iop(IOp.ADD, cp, const_index(start)))
            return [Store(x_pad, (j, at), Const(0, dt))]
        return body

    chans = x_pad.shape[0]
    body: list[Stmt] = []
    for py, px in itertools.product(range(sy), range(sx)):
        # the plane's columns that hold input columns; the rest are padding, zeroed here
        # (only what the copy does not write: a whole zeroed copy costs more stores than
        # the copy itself, and stores are what a depthwise tile spends its time on)
        c_lo, c_hi = -((px - left) // sx), (in_w - 1 + left - px) // sx + 1
        base = (py * sx + px) * geo.plane
        if c_hi <= c_lo:
            body += parallel(b.names, (chans, 1, geo.plane), zero(base, 0))
            continue
        body += parallel(b.names, (chans, rows_ph, c_hi - c_lo), copy(py, px, c_lo))
        if c_lo > 0:
            body += parallel(b.names, (chans, rows_ph, c_lo), zero(base, wc))
        if c_hi < wc:
            body += parallel(b.names, (chans, rows_ph, wc - c_hi), zero(base + c_hi, wc))
        if geo.plane > rows_ph * wc:  # what sums past the tile's rows read (into dropped columns)
            body += parallel(b.names, (chans, 1, geo.plane - rows_ph * wc), zero(base + rows_ph * wc, 0))
    planes = sy * sx * geo.plane
    if geo.per_channel > planes:  # the spread's gap: never read, zeroed so that the whole copy is written
        body += parallel(b.names, (chans, 1, geo.per_channel - planes), zero(planes, 0))
    return body


def depthwise_pitch(b: "_Builder") -> int:
    """The distance of a depthwise tile's output rows in its product tile where the sums
    stay where they are computed (``padded_width``, for rows at least
    ``ConvPolicy.depthwise_pitch_width`` wide), else 0: packed into runs of positions."""
    width = _phase_width(b) if padded_width(b) and not depthwise_planes(b) else 0
    return width if width and b.c.outputs[0].type.shape[-1] >= b.target.conv.depthwise_pitch_width else 0


def _depthwise_sums(b: "_Builder", bm: int) -> int:
    """How many positions of a depthwise tile of ``bm`` positions are summed: its output rows
    ``padded_width`` apart, rounded up to whole vectors (``ConvPolicy.depthwise_run``)."""
    rows, width = _tile_shape(b, bm)
    run = b.target.conv.depthwise_run
    return -(-((rows - 1) * _phase_width(b) + width) // run) * run


def depthwise_length(b: "_Builder", bm: int) -> int:
    """The columns of a depthwise tile's product tile: its sums where they are computed
    (``depthwise_pitch``), else its ``bm`` positions packed."""
    return _depthwise_sums(b, bm) if depthwise_pitch(b) else bm


def depthwise_padded(b: "_Builder", el: ElementBuilder, tc: Buffer, mt: Var, n0: Expr,
                     bm: int) -> tuple[tuple[Buffer, ...], list[Stmt]]:
    """A depthwise convolution from the tile's input rows copied into a zero-padded tile
    (``_Padded``). One loop along the flat index ``q`` sums every tap per position with no
    bounds check, over whole vectors (``_depthwise_sums``): into ``tc``, its output rows
    ``padded_width`` apart, where the epilogue reads them (``stores`` with ``pitch``, as a
    direct product's) where ``depthwise_pitch`` says so, else into a tile of their own,
    packed into ``tc`` (positions as ``_tile_shape``) after. Returns the on-chip buffers
    it allocates and its statements."""
    c = b.c
    w = c.inputs[1]
    dt = b.acc_dtype
    bn = tc.shape[0]
    rows, width = _tile_shape(b, bm)
    wc = _phase_width(b)
    length = _depthwise_sums(b, bm)
    geo = _Padded(b, rows, length)
    x_pad = Buffer("x_pad", dt, (bn, geo.per_channel), Scope.FRAGMENT)
    pitched = bool(depthwise_pitch(b))
    sums = tc if pitched else Buffer("dw_sums", dt, (bn, length), Scope.FRAGMENT)

    def tap_sum(i: Index) -> list[Stmt]:
        j, q = i
        ch = iop(IOp.ADD, n0, j)
        total: Expr | None = None
        for k, (ty, tx) in enumerate(geo.taps):
            wv = widen(el.at(w, (ch, const_index(0), const_index(ty), const_index(tx))), dt)
            start = geo.offset(k)
            term = Call(ScalarFn.MUL, (Load(x_pad, (j, iop(IOp.ADD, q, const_index(start)) if start else q)), wv), dt)
            total = term if total is None else Call(ScalarFn.ADD, (total, term), dt)
        return [Store(sums, (j, q), total)]  # type: ignore[arg-type]

    def pack(i: Index) -> list[Stmt]:
        j, r, col = i
        return [Store(tc, (j, linearize((r, col), (rows, width))),
                      Load(sums, (j, iop(IOp.ADD, iop(IOp.MUL, r, const_index(wc)), col))))]

    body = _padded_copy(b, el, x_pad, geo, mt, rows, lambda j: iop(IOp.ADD, n0, j))
    body += parallel(b.names, (bn, length), tap_sum)
    if pitched:
        return (x_pad,), body
    return (x_pad, sums), [*body, *parallel(b.names, (bn, rows, width), pack)]


def depthwise_planes(b: "_Builder") -> bool:
    """Whether a depthwise convolution that ``depthwise_padded`` would compute sums its
    taps over its input's channel planes where they lie instead (``depthwise_planes_tile``):
    float32 on a host whose policy asks for it at its column stride
    (``ConvPolicy.depthwise_planes``), its input a kernel input, output rows at least
    ``ConvPolicy.depthwise_pitch_width`` wide (14-wide ones took 2-3x as long: each row's
    ring and tap setup for one vector of sums; where the helper reads the rows in place,
    from ``depthwise_planes_width``: ``_rows_in_place``), and the helper's ring of padded input rows
    (one output row's reach of rows, per column phase) within
    ``ConvPolicy.depthwise_planes_ring`` bytes."""
    op = b.c.op
    x, w = b.c.inputs
    policy = b.target.conv
    if not (b.depthwise and policy.depthwise_planes and isinstance(op, Conv) and len(op.strides) == 2
            and not b.target.device.max_block_threads and padded_width(b)):
        return False
    if {b.acc_dtype, b.op_dtype, x.type.dtype} != {DType.FLOAT32} or not any(x is v for v in b.group.inputs):
        return False
    (kh, kw), (dy, dx), sx = w.type.shape[2:], op.dilations, op.strides[1]
    width = b.c.outputs[0].type.shape[-1]
    least = policy.depthwise_pitch_width
    if policy.depthwise_planes_width and _rows_in_place(b):
        least = policy.depthwise_planes_width
    if width < least or sx < policy.depthwise_planes:
        return False
    phase_row = -(-(-(-width // 16) * 16 + (kw - 1) * dx // sx) // 16) * 16  # the helper's padded row
    return ((kh - 1) * dy + 1) * sx * phase_row * 4 <= policy.depthwise_planes_ring


def has_avx512(b: "_Builder") -> bool:
    """Whether the kernels built for the target's instruction-set level have AVX-512F:
    the host helpers' in-place plane rows and 16 x 16 block transposes
    (``PLANE_TAPS_PRELUDE``, ``TRANSPOSE_PRELUDE``; elsewhere a ring copy and an element
    loop)."""
    return cpu_isa.has(cpu_isa.target_level(b.target), "avx512f")


def _rows_in_place(b: "_Builder") -> bool:
    """Whether the plane helper reads ``b``'s input rows in place (its AVX-512 path for
    unit strides and dilations); elsewhere it copies them into its ring (narrow rows
    through the ring took 4-8x the padded tile's time built for x86-64-v3)."""
    op: Conv = b.c.op  # type: ignore[assignment]
    return all(s == 1 for s in op.strides) and all(d == 1 for d in op.dilations) and has_avx512(b)


def depthwise_planes_tile(b: "_Builder", el: ElementBuilder, x_param: Buffer, tc: Buffer, mt: Var, n0: Expr,
                          bm: int) -> tuple[tuple[Buffer, ...], list[Stmt]]:
    """A depthwise convolution of the tile's channels summed over their input planes where
    they lie (``PlaneTaps``): the tile's taps copied into ``w_taps`` ([channel, tap]), the
    sums packed into ``tc`` ([channel, position], its rows of whole output rows), where the
    epilogue reads them. The host copies each input row once into a small ring of padded
    rows, where ``depthwise_padded`` copies the tile's rows into phase planes first (its
    strided copy and separate pass over the tile: a third of MobileNetV2's stride-2 layer's
    time). Returns the on-chip buffers and statements."""
    c = b.c
    op: Conv = c.op  # type: ignore[assignment]
    w = c.inputs[1]
    kh, kw = w.type.shape[2:]
    rows, width = _tile_shape(b, bm)
    img, row0 = origin(b, mt, rows)
    chans = tc.shape[0]
    w_taps = Buffer("w_taps", b.acc_dtype, (chans, kh * kw), Scope.FRAGMENT)

    def weights(i: Index) -> list[Stmt]:
        j, ty, tx = i
        return [Store(w_taps, (j, iop(IOp.ADD, iop(IOp.MUL, ty, const_index(kw)), tx)),
                      widen(el.at(w, (iop(IOp.ADD, n0, j), const_index(0), ty, tx)), b.acc_dtype))]

    taps = PlaneTaps(x_param, img, n0, w_taps, tc, row0, rows, width, (kh, kw), tuple(op.strides),  # type: ignore[arg-type]
                     tuple(op.dilations), (op.pads[0], op.pads[1]))  # type: ignore[arg-type]
    return (w_taps,), [*parallel(b.names, (chans, kh, kw), weights), taps]


def depthwise_lanes(b: "_Builder") -> int:
    """The channels of a depthwise tile computed in vector lanes (``depthwise_lanes_tile``),
    or 0 where it is not: a 2-D float32 depthwise convolution on a host whose policy asks
    for it (``ConvPolicy.depthwise_lanes``), with output rows narrower than
    ``ConvPolicy.depthwise_pitch_width``, strided, of ``depthwise_lanes_taps`` taps or
    more, or with rows that fill at most half a vector (7 x 7 maps: unstrided 3 x 3 ones
    0.77-0.79 of their time with the epilogue in the lanes), and whole tiles of that many
    channels. Along rows
    of 7 or 14 positions a vector over positions is mostly padding, tails and masks; a
    vector over channels is whole at every position, and a strided convolution's taps are
    plain vector loads. Its input a kernel input (read where it lies)."""
    op = b.c.op
    lanes = b.target.conv.depthwise_lanes
    x = b.c.inputs[0]
    if not (b.depthwise and lanes and isinstance(op, Conv) and len(op.strides) == 2 and not b.target.device.max_block_threads):
        return 0
    if {b.acc_dtype, b.op_dtype, x.type.dtype} != {DType.FLOAT32} or b.n % lanes or not any(x is v for v in b.group.inputs):
        return 0
    width = b.c.outputs[0].type.shape[-1]
    many = (math.prod(b.c.inputs[1].type.shape[2:]) >= b.target.conv.depthwise_lanes_taps or any(s > 1 for s in op.strides)
            or (width <= lanes // 2 and lanes_epilogue(b)))
    return lanes if many and width < b.target.conv.depthwise_pitch_width else 0


def depthwise_lanes_tile(b: "_Builder", el: ElementBuilder, x_param: Buffer, tc: Buffer, mt: Var, n0: Expr,
                         bm: int, in_lanes: bool = False) -> tuple[tuple[Buffer, ...], list[Stmt]]:
    """A depthwise convolution with its tile's channels in vector lanes: the tile's input
    rows copied into a zero-padded grid of positions, each a vector of the tile's channels
    (``x_lanes``, [padded position, channel]), the weights likewise (``w_lanes``, [tap,
    channel]); each output position's taps summed as whole vectors, at any stride or
    dilation, a row of positions' sums in registers (``LaneTaps`` into ``dw_lanes``,
    [position, channel]); the sums then turned back into ``tc`` ([channel, position]) for
    the epilogue, or (``in_lanes``: ``lanes_epilogue``) summed into ``tc`` itself,
    [position, channel]. The turns are 16 x 16 block transposes (``Transpose``). Returns
    the on-chip buffers and statements."""
    c = b.c
    op: Conv = c.op  # type: ignore[assignment]
    x, w = c.inputs
    dt = b.acc_dtype
    lanes = tc.shape[1] if in_lanes else tc.shape[0]
    rows, width = _tile_shape(b, bm)
    (kh, kw), (dy, dx), (sy, sx) = w.type.shape[2:], op.dilations, op.strides
    top, left, right = op.pads[0], op.pads[1], op.pads[3]
    in_h, in_w = x.type.shape[2:]
    img, row0 = origin(b, mt, rows)
    rows_in = (rows - 1) * sy + (kh - 1) * dy + 1
    wp = left + in_w + right
    x_lanes = Buffer("x_lanes", dt, (rows_in * wp, lanes), Scope.FRAGMENT)
    w_lanes = Buffer("w_lanes", dt, (kh * kw, lanes), Scope.FRAGMENT)
    sums = tc if in_lanes else Buffer("dw_lanes", dt, (bm, lanes), Scope.FRAGMENT)
    first = iop(IOp.SUB, iop(IOp.MUL, row0, const_index(sy)) if sy > 1 else row0, const_index(top))  # the tile's first input row
    last_src = (c.outputs[0].type.shape[2] - rows) * sy - top + rows_in - 1  # the last tile's last row read
    row_guard = top > 0 or last_src >= in_h

    def zeros(r: Expr, n_rows: int, col: int, cols: int) -> tuple[Stmt, ...]:
        """``n_rows`` rows of the grid from row ``r``, ``cols`` positions from ``col``: zeros."""
        def body(i: Index) -> list[Stmt]:
            row = iop(IOp.ADD, r, i[0])
            return [Store(x_lanes, (iop(IOp.ADD, iop(IOp.MUL, row, const_index(wp)), iop(IOp.ADD, i[1], const_index(col))),
                                    i[2]), Const(0, dt))]
        return parallel(b.names, (n_rows, cols, lanes), body)

    def copy(i: Index, guard: bool = row_guard) -> list[Stmt]:
        """Input row ``r`` of the tile: its channels' runs turned into a vector a position
        (zeros for a row above or below the input, where ``guard`` says it may be)."""
        (r,) = i
        src = iop(IOp.ADD, first, r)
        at = iop(IOp.ADD, iop(IOp.MUL, r, const_index(wp)), const_index(left))
        turn: Stmt = Transpose(Region(x_param, (img, n0, src, const_index(0)), (1, lanes, 1, in_w)),
                               Region(x_lanes, (at, const_index(0)), (in_w, lanes)))
        if not guard:
            return [turn]
        inside = iop(IOp.AND, iop(IOp.GE, src, const_index(0)), iop(IOp.LT, src, const_index(in_h)))
        outside = iop(IOp.OR, iop(IOp.LT, src, const_index(0)), iop(IOp.GE, src, const_index(in_h)))
        return [If(inside, (turn,)), If(outside, zeros(r, 1, left, in_w))]

    def weights(i: Index) -> list[Stmt]:
        ty, tx, j = i
        return [Store(w_lanes, (iop(IOp.ADD, iop(IOp.MUL, ty, const_index(kw)), tx), j),
                      widen(el.at(w, (iop(IOp.ADD, n0, j), const_index(0), ty, tx)), dt))]

    # the grid rows copied from the input: with one tile a map, the rows above and below
    # the input are known (zeroed whole, the rest copied unguarded); else each row checks
    lo, hi = 0, rows_in
    if isinstance(first, Const):
        lo, hi = min(max(-int(first.value), 0), rows_in), max(min(in_h - int(first.value), rows_in), 0)
        body: list[Stmt] = [*serial(b.names, (hi - lo,), lambda i: copy((iop(IOp.ADD, i[0], const_index(lo)),), False))]
        for r0, r1 in ((0, lo), (hi, rows_in)):
            if r1 > r0:
                body += zeros(const_index(r0), r1 - r0, 0, wp)
    else:
        body = [*serial(b.names, (rows_in,), copy)]
    if hi > lo:  # the padding columns of the copied rows
        body += [*(zeros(const_index(lo), hi - lo, 0, left) if left else ()),
                 *(zeros(const_index(lo), hi - lo, left + in_w, right) if right else ())]
    offsets = tuple(ty * dy * wp + tx * dx for ty, tx in itertools.product(range(kh), range(kw)))
    body += [*parallel(b.names, (kh, kw, lanes), weights),
             LaneTaps(x_lanes, w_lanes, sums, rows, width, sy * wp, sx, offsets)]
    if in_lanes:
        return (x_lanes, w_lanes), body
    body.append(Transpose(Region(sums, (const_index(0), const_index(0)), (bm, lanes)),
                          Region(tc, (const_index(0), const_index(0)), (lanes, bm))))
    return (x_lanes, w_lanes, sums), body


def lanes_epilogue(b: "_Builder") -> bool:
    """Whether a depthwise tile in lanes (``depthwise_lanes``) computes its epilogue in
    the lanes too (``lanes_stores``): the group's one output is the convolution's, as it
    is laid out (its epilogue elementwise), and every other input of the group is one
    value a channel or one for all (a batch norm's scale and shift, an activation's
    bounds): then each position's epilogue is whole vectors over the tile's channels,
    and one transpose stores the tile. A 7 x 7 map's rows of 49 positions took four
    16-float vectors each (a SiLU over 64 positions for 49), and the sums were turned
    once more before it (NOTES.md, session 35). Only where the block transpose that
    stores the tile is the AVX-512 one (``has_avx512``: built for x86-64-v3, 7 x 7 maps took
    1.17-4.2x as long)."""
    if not (b.target.conv.lanes_epilogue and len(b.group.outputs) == 1 and has_avx512(b)):
        return False
    (v,) = b.group.outputs
    out = b.c.outputs[0].type
    if v.type.shape != out.shape or v.type.dtype is not DType.FLOAT32:
        return False
    g = tuple(Var(f"_lanes{d}") for d in range(len(out.shape)))
    if tuple(b.fwd[id(v)](g)) != g:  # stored as the convolution lays it out
        return False
    x, w = b.c.inputs
    for u in b.group.inputs:
        if (u is x or u is w) and sum(y is u for n in b.group.nodes for y in n.inputs) == 1:
            continue  # read by the convolution alone (a residual of x reads it a position)
        shape = u.type.shape
        if math.prod(shape) > 1 and (len(shape) < 3 or any(d != 1 for d in shape[-2:]) or math.prod(shape[:-3]) != 1):
            return False  # a value a position (a residual): read across the lanes
    return True


def lanes_stores(b: "_Builder", el: ElementBuilder, v: Value, ob: Buffer, tc: Buffer, mt: Var, n0: Expr,
                 bm: int) -> list[Stmt]:
    """Output ``v`` of a tile whose sums are in lanes (``tc`` [position, channel]:
    ``lanes_epilogue``): its epilogue computed in place over the tile, a position's
    channels innermost (whole vectors), then the tile turned into the output's channel
    planes by one block transpose: each channel's rows there are one run."""
    rows, width = _tile_shape(b, bm)
    img, row0 = origin(b, mt, rows)
    lanes = tc.shape[1]

    def store(idx: Index) -> list[Stmt]:
        p, j = idx
        r, col = delinearize(p, (rows, width))
        g = (img, iop(IOp.ADD, n0, j), iop(IOp.ADD, row0, r), col)
        return [Store(tc, (p, j), el.at(v, b.fwd[id(v)](g)))]  # (the builder reads the sums at [p, j])

    zero = const_index(0)
    turn = Transpose(Region(tc, (zero, zero), (bm, lanes)), Region(ob, (img, n0, row0, zero), (1, lanes, rows, width)))
    return [*parallel(b.names, (bm, lanes), store), turn]


def _pointwise(b: "_Builder") -> bool:
    return math.prod(b.c.inputs[1].type.shape[2:]) == 1


def _direct_pointwise(b: "_Builder") -> bool:
    """A pointwise convolution that ``direct_width`` may copy: unit strides, no padding,
    over more than ``in_place_max_k`` channels whose planes outgrow the core's cache."""
    op, x = b.c.op, b.c.inputs[0]
    planes = math.prod(x.type.shape[1:]) * x.type.dtype.itemsize
    return (isinstance(op, Conv) and all(s == 1 for s in op.strides) and not any(op.pads)
            and b.k > b.target.conv.in_place_max_k and planes > b.onchip)


def in_place_blocks(b: "_Builder", bn: int) -> bool:
    """Whether a convolution's tiles of ``bn`` channels will be read in place (``in_place``:
    neither Winograd's nor copied by ``direct_width``), asked before its weight is bound."""
    return b.winograd is None and in_place(b, bn) and not (b.target.conv.direct and _direct_pointwise(b))


def direct_width(b: "_Builder", bn: int) -> int:
    """The padded row width (per column phase) of a convolution computed K step by K step
    from its input rows copied zero-padded on chip (``direct_product``), or 0 where it is
    not: an ungrouped 2-D float32 convolution with channels as rows on a host whose policy
    asks for it (``ConvPolicy.direct``), its constant weight bound as [Cout, K] rows, in
    whole column tiles of ``bn`` channels. A pointwise one (its im2col tile is already a
    copy of its input rows) only where its input read in place (``in_place``) would come
    from beyond the core's cache: unstrided and unpadded, over more than
    ``ConvPolicy.in_place_max_k`` input channels whose planes outgrow the core's cache
    (``Device.onchip_bytes``); each block of K rows then comes back from memory for every
    register block that reads it (by hand, ResNet-50's 56 x 56 reductions over 256
    channels: 0.84 of their time copied, 28 x 28 over 512 0.92-0.95; 14 x 14 over 1024,
    which the previous kernel left in the cache, 1.05). The copy's rows are spread over
    every set of the first-level cache (``_Padded``)."""
    op = b.c.op
    x = b.c.inputs[0]
    if not isinstance(op, Conv) or (_pointwise(b) and not _direct_pointwise(b)):
        return 0
    if not (b.flip and not b.depthwise and b.groups == 1 and b.target.conv.direct and len(op.strides) == 2
            and gemm_weights.packs_conv_rows(b) and b.packed is not None
            and {b.acc_dtype, b.op_dtype, x.type.dtype} == {DType.FLOAT32} and b.n % bn == 0):
        return 0
    return _phase_width(b)


def direct_length(b: "_Builder", bm: int) -> int:
    """The columns of a direct convolution's product tile of ``bm`` positions: its output
    rows ``direct_width`` apart (``_Padded``), the last one as wide as an output row."""
    rows, width = _tile_shape(b, bm)
    return (rows - 1) * _phase_width(b) + width


def direct_product(b: "_Builder", el: ElementBuilder, tc: Buffer, mt: Var, bm: int, n0: Expr, kt: Var,
                   chans: int) -> tuple[tuple[Buffer, ...], list[Stmt]]:
    """K step ``kt`` of a direct convolution (``direct_width``): the step's ``chans`` input
    channels of the tile's input rows copied zero-padded (``_Padded``), then one product of
    the tile's rows of the bound [Cout, K] weight by rows of that copy, each (channel, tap)
    a row at its constant offset (``TapGemm``): no im2col tile. ``tc`` holds the products
    with output rows ``padded_width`` apart (``direct_length``); the epilogue reads them
    there (``stores`` with ``pitch``). Returns the copy's buffer and the step's statements."""
    assert b.packed is not None
    rows, _ = _tile_shape(b, bm)
    geo = _Padded(b, rows, tc.shape[1], spread=True)
    x_pad = Buffer("x_pad", b.acc_dtype, (chans, geo.per_channel), Scope.FRAGMENT)
    ch0 = iop(IOp.MUL, kt, chans)
    body = _padded_copy(b, el, x_pad, geo, mt, rows, lambda j: iop(IOp.ADD, b.in_channel0, iop(IOp.ADD, ch0, j)))
    per_k = chans * len(geo.taps)
    a = Region(b.packed, (n0, iop(IOp.MUL, kt, per_k)), (tc.shape[0], per_k))
    offsets = tuple(cl * geo.per_channel + geo.offset(t) for cl in range(chans) for t in range(len(geo.taps)))
    return (x_pad,), [*body, TapGemm(a, x_pad, offsets, tc)]
