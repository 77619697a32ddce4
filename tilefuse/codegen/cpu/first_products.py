"""Products that start their accumulator at zero, instead of a zeroing pass before them.

A tile program zeroes a product's accumulator (``Fill(c, 0)``) and then accumulates into
it, ``c += A @ B``, once per K step; its allocation zeroes it too (a C declaration's
``= {0}``, ``tf_alloc``). On a host the first product can start its registers at zero
instead (the product core's ``zero`` flag: c = A @ B, c not read), bit for bit the same
(``0 + x`` is ``x``), without writing the tile twice and reading it back: ResNet-50's
56 x 56 pointwise convolutions spent 5% of their time in those passes.

``plan`` finds, in every statement list, a zero Fill of a local tile followed either by a
float32 product into all of it, or by a serial loop whose first statement to touch the
tile is such a product (a K loop): the Fill is not printed and the product starts at zero
always, or where the loop's variable is 0. A Fill whose tile is overwritten whole before
anything reads it (a depthwise convolution's sums copied into the product tile) is not
printed either. It also names the local tiles whose allocation need not be zeroed: the
first statement that touches them writes all of them before anything reads them (a Fill,
printed or not; a loop nest that stores every element; a transpose into all of it; a
serial loop whose first such statement does), or the first few together do (a copy in
pieces and nests zeroing its padding: counted element by element).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tilefuse.ir.dtypes import DType
from tilefuse.tile_ir.ir import (Buffer, Const, Expr, Fill, Gemm, If, IndexOp, IOp, LaneTaps, Loop, LoopKind, PanelGemm, PlaneTaps,
                                 Stmt, Store, StridedGemm, TapGemm, TileProgram, Transpose, Var, Winograd, statements)
from tilefuse.tile_ir.nests import stmt_reads


@dataclass
class Starts:
    """What ``plan`` found: statements are keyed by identity (the printed program's own)."""

    # product -> the loop variable whose first iteration starts it at zero (None: always)
    products: dict[int, Var | None] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)  # Fills not printed
    raw: set[str] = field(default_factory=set)  # local tiles allocated without zeroing


def plan(program: TileProgram) -> Starts:
    out = Starts()
    local = {b.name for b in program.allocs}
    _block(program.body, local, out)
    for b in program.allocs:
        if _written_first(program.body, b):
            out.raw.add(b.name)
    return out


def _written_first(body: tuple[Stmt, ...], b: Buffer) -> bool:
    """Whether the first of ``body``'s statements to touch ``b`` writes all of it before
    anything reads it: a Fill; a loop nest storing every element once, reading none; a
    transpose into all of it; a serial loop that runs, whose own first such statement
    does (a K loop's operand tiles, a chain's hidden tile); or a run of nests that
    together store all of it (``_nests_cover``)."""
    touching = [s for s in body if _touches(s, b)]
    first = touching[0] if touching else None
    if isinstance(first, Fill):
        return first.buffer == b
    if isinstance(first, Winograd):  # its scratch, and its product tile where the block fills it
        return b in (first.v, first.m) or (b == first.c and first.rows * first.width == b.shape[1])
    if isinstance(first, PlaneTaps):  # its sums, where they fill the tile
        return b == first.out and first.rows * first.width == b.shape[1] and b not in (first.x, first.w)
    if isinstance(first, LaneTaps):  # its sums over channel vectors, where they fill the tile
        return b == first.out and first.rows * first.width == b.shape[0] and b not in (first.x, first.w)
    if isinstance(first, Transpose):  # the whole of b turned from another buffer
        return (first.dst.buffer == b and first.src.buffer != b and first.dst.extents == b.shape
                and all(isinstance(o, Const) and o.value == 0 for o in first.dst.offsets))
    if not isinstance(first, Loop) or first.extent <= 0:
        return False
    if _stores_all(first, b):
        return True
    if first.kind is not LoopKind.PARALLEL and _written_first(first.body, b):
        return True
    return _nests_cover(touching, b)


def _nests_cover(stmts: list[Stmt], b: Buffer, limit: int = 1 << 22) -> bool:
    """Whether the leading run of ``stmts`` that are perfect nests storing to ``b`` (one
    unconditional store or transpose into ``b`` each, at per-dim indices or region offsets
    that are sums of the nest's variables times constants plus a constant, nothing else in
    them reading ``b``) together store every element of ``b``: a tile copied in pieces,
    its padding zeroed by nests of their own (``conv_rows._padded_copy``,
    ``depthwise_lanes_tile``). Counted element by element, up to ``limit`` of them."""
    size = math.prod(b.shape)
    if size > limit:
        return False
    covered = np.zeros(size, bool)
    strides = [math.prod(b.shape[d + 1:]) for d in range(len(b.shape))]
    for nest in stmts:
        extent: dict[Var, int] = {}
        leaf: Stmt | None = nest
        while isinstance(leaf, Loop) and len(leaf.body) == 1:
            extent[leaf.var] = leaf.extent
            leaf = leaf.body[0]
        if isinstance(leaf, Loop):  # a loop of more than one statement: stores only
            extent[leaf.var] = leaf.extent
            stores = [x for x in leaf.body if isinstance(x, Store) and x.buffer == b]
            leaf = stores[0] if len(stores) == 1 else None
        if isinstance(leaf, Store) and leaf.buffer == b and not any(stmt_reads(x, b) for x in statements((nest,))):
            indices, boxes = leaf.indices, [1] * len(b.shape)
        elif isinstance(leaf, Transpose) and leaf.dst.buffer == b and leaf.src.buffer != b:
            indices, boxes = leaf.dst.offsets, list(leaf.dst.extents)
        else:
            return False
        if (len(indices) != len(b.shape) or (extent and min(extent.values()) <= 0)
                or math.prod(extent.values()) * math.prod(boxes) > limit):
            return False
        axes = {v: i for i, v in enumerate(extent)}
        rank = len(axes) + len(b.shape)  # the nest's variables, then a box's own dims
        flat = np.zeros((1,) * rank, np.int64)
        for d, (index, size_d, stride) in enumerate(zip(indices, b.shape, strides)):
            terms = _affine(index)
            if terms is None or any(v not in axes for v, _ in terms[0]):
                return False
            at = np.full((1,) * rank, terms[1], np.int64)
            for v, scale in terms[0]:
                shape = [1] * rank
                shape[axes[v]] = extent[v]
                at = at + scale * np.arange(extent[v], dtype=np.int64).reshape(shape)
            box = [1] * rank
            box[len(axes) + d] = boxes[d]
            at = at + np.arange(boxes[d], dtype=np.int64).reshape(box)
            if at.min() < 0 or at.max() >= size_d:
                return False
            flat = flat + at * stride
        covered[flat.ravel()] = True
        if covered.all():
            return True
    return False


def _affine(e: Expr) -> tuple[list[tuple[Var, int]], int] | None:
    """``e`` as (variable, factor) terms plus a constant, where it is a sum of variables
    times integer constants and integer constants, else None."""
    if isinstance(e, Var):
        return [(e, 1)], 0
    if isinstance(e, Const) and isinstance(e.value, int):
        return [], int(e.value)
    if isinstance(e, IndexOp) and e.op is IOp.ADD:
        a, b = _affine(e.a), _affine(e.b)
        return None if a is None or b is None else (a[0] + b[0], a[1] + b[1])
    if isinstance(e, IndexOp) and e.op is IOp.MUL:
        for x, k in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, Const) and isinstance(k.value, int):
                inner = _affine(x)
                return None if inner is None else ([(v, f * int(k.value)) for v, f in inner[0]], inner[1] * int(k.value))
    return None


def _stores_all(nest: Loop, b: Buffer) -> bool:
    """A perfect nest of loops (each body one loop, down to the innermost) whose innermost
    body stores to ``b`` unconditionally at per-dim indices that are sums of the nest's
    variables (each maybe times a constant), each variable in one dim, those of extent
    over 1 there the digits of its index (every position once); nothing in the nest
    reads ``b``."""
    extent: dict[Var, int] = {}
    loop = nest
    while True:
        if loop.extent <= 0:
            return False
        extent[loop.var] = loop.extent
        if len(loop.body) == 1 and isinstance(loop.body[0], Loop):
            loop = loop.body[0]
            continue
        break
    if any(stmt_reads(x, b) for x in statements((nest,))):
        return False
    stores = [x for x in loop.body if isinstance(x, Store) and x.buffer == b]
    if len(stores) != 1 or len(stores[0].indices) != len(b.shape):
        return False
    used: set[Var] = set()
    for index, size in zip(stores[0].indices, b.shape):
        terms = _vars_scaled(index)
        if terms is None or any(v not in extent or v in used for v, _ in terms):
            return False
        used.update(v for v, _ in terms)
        # the variables of extent over 1, by stride: digits of the dim's index in mixed
        # radix (rows of a tile stored as two runs of a plane row: i * 112 + j, j < 112),
        # so every position of the dim is stored once
        wide = sorted((scale, extent[v]) for v, scale in terms if extent[v] > 1)
        step = 1
        for scale, n in wide:
            if scale != step:
                return False
            step *= n
        if step != size:
            return False
    return True


def _vars_scaled(e: Expr) -> list[tuple[Var, int]] | None:
    """The variables of ``e`` and their constant factors where it is a sum of variables,
    each alone or times a positive constant, else None."""
    if isinstance(e, Var):
        return [(e, 1)]
    if isinstance(e, IndexOp) and e.op is IOp.ADD:
        a, b = _vars_scaled(e.a), _vars_scaled(e.b)
        return None if a is None or b is None else a + b
    if isinstance(e, IndexOp) and e.op is IOp.MUL:
        for v, k in ((e.a, e.b), (e.b, e.a)):
            if isinstance(v, Var) and isinstance(k, Const) and isinstance(k.value, int) and k.value > 0:
                return [(v, int(k.value))]
    return None


def _block(body: tuple[Stmt, ...], local: set[str], out: Starts) -> None:
    for i, s in enumerate(body):
        if isinstance(s, (Loop, If)):
            _block(s.body, local, out)
        if not (isinstance(s, Fill) and s.buffer.name in local) or i + 1 == len(body):
            continue
        if _written_first(body[i + 1:], s.buffer):  # overwritten before it is read
            out.dropped.add(id(s))
            continue
        if not _is_zero(s):
            continue
        nxt = body[i + 1]
        if _overwrites(nxt, s.buffer):
            out.products[id(nxt)] = None
            out.dropped.add(id(s))
        elif isinstance(nxt, Loop) and nxt.kind is not LoopKind.PARALLEL and nxt.extent > 0:
            first = _first_touch(nxt.body, s.buffer)
            if first is not None and _overwrites(first, s.buffer) and id(first) not in out.products:
                out.products[id(first)] = nxt.var
                out.dropped.add(id(s))


def _is_zero(s: Fill) -> bool:
    v = s.value.value
    return v == 0 and math.copysign(1.0, v) > 0  # not -0.0


def _overwrites(s: Stmt, buf: Buffer) -> bool:
    """A float32 product into the whole of ``buf`` through the product core (which takes
    the ``zero`` flag): a Gemm without transposes on its fast path, a float PanelGemm (its
    rows may stop short of the tile where A does: the printer zeroes the tile there), a
    StridedGemm or a TapGemm."""
    if isinstance(s, Gemm):
        m = s.a.shape[0]
        return (s.c == buf and not (s.trans_a or s.trans_b) and m == buf.shape[0]
                and s.a.dtype is s.b.dtype is s.c.dtype is DType.FLOAT32)
    if isinstance(s, PanelGemm):
        return s.c == buf and s.k_group == 1 and buf.dtype is DType.FLOAT32
    if isinstance(s, StridedGemm):
        return s.c == buf and buf.dtype is DType.FLOAT32 and s.a.buffer != buf and s.b.buffer != buf
    if isinstance(s, TapGemm):
        return s.c == buf and buf.dtype is DType.FLOAT32 and s.a.buffer != buf and s.b != buf
    return False


def _first_touch(body: tuple[Stmt, ...], buf: Buffer) -> Stmt | None:
    """The first of ``body``'s statements to read or write ``buf`` (a loop or branch as a
    whole), or None."""
    return next((s for s in body if _touches(s, buf)), None)


def _touches(s: Stmt, buf: Buffer) -> bool:
    """Whether ``s`` or anything inside it reads or writes ``buf``."""
    return any(stmt_reads(x, buf) or isinstance(x, (Store, Fill)) and x.buffer == buf for x in statements((s,)))
