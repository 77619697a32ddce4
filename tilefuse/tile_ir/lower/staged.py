"""The general schedule: any group, as one tile that computes it in stages.

Values that cannot be inlined as element expressions — reductions, contractions,
scatters, top-k style ops never reach here (they are opaque groups) — are *staged*: each
gets an on-chip buffer of its full shape, computed by a loop nest whose inputs are
inlined element expressions. The group's outputs are then written by parallel loops.
This schedule is correct for every group the partitioner makes; the specialised
schedules (tiled GEMM with epilogue, flash attention, row-tiled norms) are faster and
are chosen first where they apply.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import (
    Conv,
    ConvTranspose,
    MatMul,
    Reduce,
    ScalarFn,
    ScatterElements,
    ScatterND,
    WindowReduce,
)
from tilefuse.partition.model import FusedGroup
from tilefuse.patterns import STAGED, StagedMatch
from tilefuse.target import CPU, Target
from tilefuse.tile_ir.ir import (
    Buffer,
    Call,
    Const,
    Copy,
    Expr,
    Fill,
    Gemm,
    IOp,
    Load,
    Loop,
    LoopKind,
    Region,
    Scope,
    Stmt,
    Store,
    TileProgram,
    Var,
    const_index,
    iop,
    statements,
)
from tilefuse.tile_ir.lower.common import (
    COMBINE,
    TILE_K,
    TILE_M,
    TILE_N,
    Names,
    accumulator_dtype,
    guard_all,
    identity,
    parallel,
    scatter_combine,
    serial,
    widen,
)
from tilefuse.tile_ir.lower.elements import (
    ElementBuilder,
    Index,
    broadcast_index,
    index_position,
    transposed_source,
    window_source,
)
from tilefuse.tile_ir.lower.params import kernel_params
from tilefuse.tile_ir.schedule import StagedSchedule


def lower_staged(group: FusedGroup, match: StagedMatch, name: str,
                 target: Target = CPU) -> tuple[TileProgram, tuple[Value, ...]]:
    """The staged program and the values bound to its params (every group has one: the
    match only says why no specialised pattern applied)."""
    names = Names()
    kp = kernel_params(group)
    params, buffers, num_inputs, outs = kp.params, kp.buffers, kp.num_inputs, kp.outputs

    accum: dict[int, Buffer] = {}  # staged value -> its (possibly wider) buffer
    layouts: dict[int, Callable[[Index], Index]] = {}  # staged values stored in another layout

    def read(v: Value, idx: Index) -> Expr:
        buf = buffers[id(v)]
        load: Expr = Load(buf, layouts[id(v)](idx) if id(v) in layouts else idx)
        return load if buf.dtype is v.type.dtype else Call(ScalarFn.CAST, (load,), v.type.dtype)

    elements = ElementBuilder(buffers, read, kp.sites)
    allocs: list[Buffer] = []
    body: list[Stmt] = []
    for node in group.nodes:
        if not isinstance(node.op, STAGED):
            continue
        outs_n = []
        for j, v in enumerate(node.outputs):
            dtype = accumulator_dtype(v.type.dtype)
            shape = v.type.shape
            if isinstance(node.op, Conv):  # implicit GEMM: rows are output positions
                shape, layouts[id(v)] = _conv_layout(v.type.shape)
            buf = Buffer(f"s{len(allocs)}", dtype, shape, Scope.SHARED)
            allocs.append(buf)
            outs_n.append(buf)
        body += _STAGE[type(node.op)](names, elements, node, outs_n, allocs)
        for v, buf in zip(node.outputs, outs_n):
            buffers[id(v)] = buf
            accum[id(v)] = buf
        elements.memo.clear()
    for v, out in zip(group.outputs, outs):
        body += parallel(names, v.type.shape, lambda idx, v=v, out=out: [Store(out, idx, elements.at(v, idx))])
    scratch = sum(b.dtype.itemsize * math.prod(b.shape) for b in allocs)
    notes = (f"staged: {len(allocs)} on-chip buffers, {scratch} bytes",)
    # the tiles of each product stage, as its Gemm statements hold them (a: rows x K, b: K x columns)
    products = tuple((g.a.shape[0], g.b.shape[1], g.a.shape[1]) for g in statements(body) if isinstance(g, Gemm))
    threads = target.staged.threads  # (the thread fitting pass narrows it to divide every stage's nests)
    schedule = StagedSchedule(reason=match.reason, buffers=len(allocs), scratch_bytes=scratch, product_tiles=products,
                              threads=threads)
    program = TileProgram(name, tuple(params), num_inputs, (1,), (Var("bx"),), threads, tuple(allocs), tuple(body),
                          notes, schedule=schedule)
    return program, tuple(kp.bindings)


# -- stages ---------------------------------------------------------------------------
def _reduce(names: Names, el: ElementBuilder, node: Node, outs: list[Buffer], allocs: list[Buffer]) -> list[Stmt]:
    op: Reduce = node.op  # type: ignore[assignment]
    (x,), (acc,) = node.inputs, outs
    shape = x.type.shape
    kept = [a for a in range(len(shape)) if a not in op.axes]

    def out_index(full: Index) -> Index:
        return tuple(full[a] if a in kept else const_index(0) for a in range(len(shape))) if op.keepdims else tuple(
            full[a] for a in kept
        )

    def body(kidx: Index) -> list[Stmt]:
        init = Store(acc, _out_idx(kidx, op, shape), identity(op.fn, acc.dtype))

        def inner(ridx: Index) -> list[Stmt]:
            full = _merge(kidx, ridx, kept, op.axes, len(shape))
            val = el.at(x, full)
            if x.type.dtype is not acc.dtype:
                val = Call(ScalarFn.CAST, (val,), acc.dtype)
            o = out_index(full)
            return [Store(acc, o, Call(COMBINE[op.fn], (Load(acc, o), val), acc.dtype))]

        return [init, *serial(names, [shape[a] for a in op.axes], inner)]

    return list(parallel(names, [shape[a] for a in kept], body))


def _out_idx(kidx: Index, op: Reduce, shape: Sequence[int]) -> Index:
    if not op.keepdims:
        return kidx
    it = iter(kidx)
    return tuple(const_index(0) if a in op.axes else next(it) for a in range(len(shape)))


def _merge(kidx: Index, ridx: Index, kept: Sequence[int], axes: Sequence[int], rank: int) -> Index:
    full: list[Expr] = [const_index(0)] * rank
    for a, e in zip(kept, kidx):
        full[a] = e
    for a, e in zip(axes, ridx):
        full[a] = e
    return tuple(full)


def _window(names: Names, el: ElementBuilder, node: Node, outs: list[Buffer], allocs: list[Buffer]) -> list[Stmt]:
    op: WindowReduce = node.op  # type: ignore[assignment]
    (x,), (acc,) = node.inputs, outs
    k = len(op.kernel)
    in_shape, out_shape = x.type.shape, node.outputs[0].type.shape
    lead = len(in_shape) - k

    def body(oidx: Index) -> list[Stmt]:
        def inner(widx: Index) -> list[Stmt]:
            pos, cond = window_source(oidx[lead:], widx, op.strides, op.dilations, op.pads, in_shape[lead:])
            val = el.at(x, (*oidx[:lead], *pos))
            if x.type.dtype is not acc.dtype:
                val = Call(ScalarFn.CAST, (val,), acc.dtype)
            val = Call(ScalarFn.WHERE, (cond, val, identity(op.fn, acc.dtype)), acc.dtype)  # type: ignore[arg-type]
            return [Store(acc, oidx, Call(COMBINE[op.fn], (Load(acc, oidx), val), acc.dtype))]

        return [Store(acc, oidx, identity(op.fn, acc.dtype)), *serial(names, op.kernel, inner)]

    return list(parallel(names, out_shape, body))


def _tiled_gemm(
    names: Names,
    allocs: list[Buffer],
    dtype: DType,
    m: int,
    n: int,
    k: int,
    a_elem: Callable[[Expr, Expr], Expr],
    b_elem: Callable[[Expr, Expr], Expr],
    dst: Callable[[Expr, Expr, int, int], Region],
) -> list[Stmt]:
    """C[m, n] = sum_k A[m, k] B[k, n] by tiles: operand tiles are filled from element
    expressions (prologues inline; tails read as zero), multiplied by Gemm statements
    over K tiles, and the C tile is copied to ``dst(m0, n0, bm, bn)`` (tails clipped)."""
    if m == 0 or n == 0:
        return []  # C is empty: nothing to write
    # K of 0: C is zeros (the K loop runs no trips over operand tiles one element deep)
    bm, bn, bk = min(m, TILE_M), min(n, TILE_N), max(1, min(k, TILE_K))
    ta = Buffer(f"s{len(allocs)}", dtype, (bm, bk), Scope.SHARED)
    tb = Buffer(f"s{len(allocs) + 1}", dtype, (bk, bn), Scope.SHARED)
    tc = Buffer(f"s{len(allocs) + 2}", dtype, (bm, bn), Scope.FRAGMENT)
    allocs += [ta, tb, tc]
    mt, nt, kt = names.var("mt"), names.var("nt"), names.var("kt")
    m0, n0, k0 = iop(IOp.MUL, mt, bm), iop(IOp.MUL, nt, bn), iop(IOp.MUL, kt, bk)

    def fill_a(idx: Index) -> list[Stmt]:
        row, col = iop(IOp.ADD, m0, idx[0]), iop(IOp.ADD, k0, idx[1])
        val = a_elem(row, col)
        conds = ([iop(IOp.LT, row, m)] if m % bm else []) + ([iop(IOp.LT, col, k)] if k % bk else [])
        return [Store(ta, idx, guard_all(conds, val, dtype))]

    def fill_b(idx: Index) -> list[Stmt]:
        row, col = iop(IOp.ADD, k0, idx[0]), iop(IOp.ADD, n0, idx[1])
        val = b_elem(row, col)
        conds = ([iop(IOp.LT, row, k)] if k % bk else []) + ([iop(IOp.LT, col, n)] if n % bn else [])
        return [Store(tb, idx, guard_all(conds, val, dtype))]

    k_loop = Loop(kt, -(-k // bk), LoopKind.PIPELINED, (
        *parallel(names, (bm, bk), fill_a),
        *parallel(names, (bk, bn), fill_b),
        Gemm(ta, tb, tc),
    ), stages=2)
    tile = (Fill(tc, Const(0, dtype)), k_loop, Copy(Region(tc, (const_index(0), const_index(0)), (bm, bn)), dst(m0, n0, bm, bn)))
    return [Loop(mt, -(-m // bm), LoopKind.SERIAL, (Loop(nt, -(-n // bn), LoopKind.SERIAL, tile),))]


def _matmul(names: Names, el: ElementBuilder, node: Node, outs: list[Buffer], allocs: list[Buffer]) -> list[Stmt]:
    """Batched product: a tiled GEMM per batch index."""
    a, b = node.inputs
    (acc,) = outs
    out_shape = node.outputs[0].type.shape
    batch, (m, n), kdim = out_shape[:-2], out_shape[-2:], a.type.shape[-1]

    def per_batch(bidx: Index) -> list[Stmt]:
        a_batch = broadcast_index(bidx, a.type.shape[:-2], batch)
        b_batch = broadcast_index(bidx, b.type.shape[:-2], batch)
        return _tiled_gemm(
            names, allocs, acc.dtype, m, n, kdim,
            lambda r, c: widen(el.at(a, a_batch + (r, c)), acc.dtype),
            lambda r, c: widen(el.at(b, b_batch + (r, c)), acc.dtype),
            lambda m0, n0, bm, bn: Region(acc, bidx + (m0, n0), (1,) * len(batch) + (bm, bn)),
        )

    return list(serial(names, batch, per_batch))


def _conv_layout(shape: Sequence[int]) -> tuple[tuple[int, ...], Callable[[Index], Index]]:
    """A conv result [N, M, *S] is staged as [N * prod(S), M]: GEMM rows are positions."""
    spatial = tuple(shape[2:])
    positions = shape[0] * math.prod(spatial)

    def index(idx: Index) -> Index:
        from tilefuse.tile_ir.lower.elements import linearize

        return (linearize((idx[0], *idx[2:]), (shape[0], *spatial)), idx[1])

    return (positions, shape[1]), index


def _conv(names: Names, el: ElementBuilder, node: Node, outs: list[Buffer], allocs: list[Buffer]) -> list[Stmt]:
    """Convolution as an implicit GEMM per group: rows are output positions (n, *o),
    columns output channels, K runs over (input channel, *taps); the input tile is an
    im2col expression with zero padding as a guard."""
    from tilefuse.tile_ir.lower.elements import delinearize

    op: Conv = node.op  # type: ignore[assignment]
    x, w = node.inputs
    (acc,) = outs
    out_shape = node.outputs[0].type.shape
    spatial = out_shape[2:]
    cg, taps = w.type.shape[1], w.type.shape[2:]
    mg = w.type.shape[0] // op.groups
    rows, kdim = out_shape[0] * math.prod(spatial), cg * math.prod(taps)

    def per_group(gidx: Index) -> list[Stmt]:
        g = gidx[0] if gidx else const_index(0)

        def a_elem(r: Expr, c: Expr) -> Expr:
            n, *o = delinearize(r, (out_shape[0], *spatial))
            ch, *t = delinearize(c, (cg, *taps))
            pos, cond = window_source(o, t, op.strides, op.dilations, op.pads, x.type.shape[2:])
            val = widen(el.at(x, (n, iop(IOp.ADD, iop(IOp.MUL, g, cg), ch), *pos)), acc.dtype)
            return Call(ScalarFn.WHERE, (cond, val, Const(0, acc.dtype)), acc.dtype)  # type: ignore[arg-type]

        def b_elem(c: Expr, col: Expr) -> Expr:
            ch, *t = delinearize(c, (cg, *taps))
            return widen(el.at(w, (iop(IOp.ADD, iop(IOp.MUL, g, mg), col), ch, *t)), acc.dtype)

        return _tiled_gemm(
            names, allocs, acc.dtype, rows, mg, kdim, a_elem, b_elem,
            lambda m0, n0, bm, bn: Region(acc, (m0, iop(IOp.ADD, iop(IOp.MUL, g, mg), n0)), (bm, bn)),
        )

    return list(serial(names, (op.groups,), per_group)) if op.groups > 1 else per_group(())


def _conv_transpose(names: Names, el: ElementBuilder, node: Node, outs: list[Buffer], allocs: list[Buffer]) -> list[Stmt]:
    """Gather form: out[n, m, o] = sum over (c, tap) with o + pad - tap*dil = i*stride."""
    op: ConvTranspose = node.op  # type: ignore[assignment]
    x, w = node.inputs
    (acc,) = outs
    out_shape = node.outputs[0].type.shape
    mg = w.type.shape[1]
    cg = x.type.shape[1] // op.groups

    def body(oidx: Index) -> list[Stmt]:
        n, m = oidx[0], oidx[1]
        group = iop(IOp.FLOORDIV, m, mg)
        mm = iop(IOp.MOD, m, mg)

        def inner(ridx: Index) -> list[Stmt]:
            c, taps = ridx[0], ridx[1:]
            cin = iop(IOp.ADD, iop(IOp.MUL, group, cg), c)
            pos, cond = transposed_source(oidx[2:], taps, op.strides, op.dilations, op.pads, x.type.shape[2:])
            xv = Call(ScalarFn.WHERE, (cond, widen(el.at(x, (n, cin, *pos)), acc.dtype), Const(0, acc.dtype)), acc.dtype)
            wv = widen(el.at(w, (cin, mm, *taps)), acc.dtype)
            return [Store(acc, oidx, Call(ScalarFn.ADD, (Load(acc, oidx), Call(ScalarFn.MUL, (xv, wv), acc.dtype)), acc.dtype))]

        return [Store(acc, oidx, Const(0, acc.dtype)), *serial(names, (cg, *w.type.shape[2:]), inner)]

    return list(parallel(names, out_shape, body))


def _scatter_nd(names: Names, el: ElementBuilder, node: Node, outs: list[Buffer], allocs: list[Buffer]) -> list[Stmt]:
    op: ScatterND = node.op  # type: ignore[assignment]
    data, ind, upd = node.inputs
    (res,) = outs
    stmts = list(parallel(names, data.type.shape, lambda idx: [Store(res, idx, widen(el.at(data, idx), res.dtype))]))
    last = ind.type.shape[-1]
    upd_lead = ind.type.shape[:-1]

    def body(uidx: Index) -> list[Stmt]:
        def inner(tail: Index) -> list[Stmt]:
            coords = tuple(
                index_position(el.sites, node, j, el.at(ind, uidx + (const_index(j),)), ind.type.dtype, data.type.shape[j])
                for j in range(last)
            )
            where = coords + tail
            val = widen(el.at(upd, uidx + tail), res.dtype)
            return [Store(res, where, scatter_combine(op.reduction, Load(res, where), val, res.dtype))]

        return list(serial(names, data.type.shape[last:], inner))

    return stmts + list(serial(names, upd_lead, body))


def _scatter_elements(names: Names, el: ElementBuilder, node: Node, outs: list[Buffer], allocs: list[Buffer]) -> list[Stmt]:
    op: ScatterElements = node.op  # type: ignore[assignment]
    data, ind, upd = node.inputs
    (res,) = outs
    stmts = list(parallel(names, data.type.shape, lambda idx: [Store(res, idx, widen(el.at(data, idx), res.dtype))]))

    def body(uidx: Index) -> list[Stmt]:
        where = list(uidx)
        where[op.axis] = index_position(el.sites, node, 0, el.at(ind, uidx), ind.type.dtype, data.type.shape[op.axis])
        val = widen(el.at(upd, uidx), res.dtype)
        return [Store(res, tuple(where), scatter_combine(op.reduction, Load(res, tuple(where)), val, res.dtype))]

    return stmts + list(serial(names, ind.type.shape, body))


_STAGE = {
    Reduce: _reduce,
    WindowReduce: _window,
    MatMul: _matmul,
    Conv: _conv,
    ConvTranspose: _conv_transpose,
    ScatterND: _scatter_nd,
    ScatterElements: _scatter_elements,
}
