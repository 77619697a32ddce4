"""Parallel nests of a tile program: the unit a block's threads are split over.

A parallel loop and the parallel loops directly nested in it form one nest (one
``T.Parallel`` on the GPU); its iterations are the product of their extents. The thread
fitting pass, the verifier and the CUDA printer all reason about nests, so they read
them from here.
"""
from __future__ import annotations

import math

from tilefuse.ir.dtypes import DType
from tilefuse.tile_ir.ir import (Buffer, Const, Copy, Expr, Gemm, If, IndexOp, IOp, LaneTaps, Load, Loop, LoopKind, PanelGemm,
                                 PlaneTaps, ReduceTile, Stmt, Store, StridedGemm, TapGemm, Transpose, Var, Winograd, subexpressions)


def parallel_nest(s: Loop) -> list[Loop]:
    """``s`` and the parallel loops directly nested in it: one nest."""
    loops = [s]
    while len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], Loop) and loops[-1].body[0].kind is LoopKind.PARALLEL:
        loops.append(loops[-1].body[0])
    return loops


def parallel_totals(stmts: tuple[Stmt, ...]) -> list[int]:
    """Iterations of each parallel nest in ``stmts``, outer nests before inner ones."""
    out: list[int] = []
    for s in stmts:
        if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL:
            nest = parallel_nest(s)
            out.append(math.prod(l.extent for l in nest))
            out += parallel_totals(nest[-1].body)
        elif isinstance(s, (Loop, If)):
            out += parallel_totals(s.body)
    return out


def uneven_nests(stmts: tuple[Stmt, ...], threads: int) -> list[int]:
    """The nests at least ``threads`` long that ``threads`` does not divide. TileLang lays
    a parallel nest out over a block's threads evenly where it vectorises it or holds it
    per thread: uneven, it has no layout ("Mapped indices are not independent": a 7 x 7 x
    64 convolution tile on 128 threads, a depthwise tile of 2 x 48 x 4 on 256). Some uneven
    nests it guards instead (scalar copies into shared memory), but which is its decision,
    so every nest counts."""
    return [n for n in parallel_totals(stmts) if n >= threads and n % threads]


def accumulation(body: tuple[Stmt, ...]) -> tuple[Store, Loop, Store, tuple[Store, ...]] | None:
    """A parallel nest's body as ``[b[i] = init, for j... (serial): b[i] = f(b[i], ...),
    *after]``: a running reduction per parallel index (the row stage of whole-row
    epilogues; a pooling window, whose taps may be a nest of serial loops), then stores
    that may read b[i] (the window's epilogue); as (init, the outer serial loop, the
    update, after), or None."""
    if len(body) < 2 or not isinstance(body[0], Store) or not isinstance(body[1], Loop):
        return None
    init, inner, after = body[0], body[1], body[2:]
    loop = inner
    while loop.kind is not LoopKind.PARALLEL and len(loop.body) == 1 and isinstance(loop.body[0], Loop):
        loop = loop.body[0]
    if loop.kind is LoopKind.PARALLEL or len(loop.body) != 1 or not isinstance(loop.body[0], Store):
        return None
    update = loop.body[0]
    if update.buffer != init.buffer or update.indices != init.indices:
        return None
    stores = tuple(s for s in after if isinstance(s, Store))
    if len(stores) != len(after):
        return None
    return init, inner, update, stores


def reads(e: Expr, buffer: Buffer) -> bool:
    """Whether ``e`` loads from ``buffer``."""
    return any(isinstance(x, Load) and x.buffer == buffer for x in subexpressions(e))


def stmt_reads(s: Stmt, buffer: Buffer) -> bool:
    """Whether ``s`` reads ``buffer``: a product, tile reduction or copy that names it, or
    a load of it in a store, in a branch's condition or in a branch's statements (a loop's
    body is not looked into: see ``ir.statements``)."""
    if isinstance(s, Gemm):
        return buffer in (s.a, s.b, s.c)
    if isinstance(s, PanelGemm):
        return buffer in (s.a.buffer, s.b, s.c)
    if isinstance(s, StridedGemm):
        return buffer in (s.a.buffer, s.b.buffer, s.c)
    if isinstance(s, TapGemm):
        return buffer in (s.a.buffer, s.b, s.c)
    if isinstance(s, Transpose):
        return buffer in (s.src.buffer, s.dst.buffer)
    if isinstance(s, LaneTaps):
        return buffer in (s.x, s.w, s.out)
    if isinstance(s, PlaneTaps):
        return buffer in (s.x, s.w, s.out) or any(reads(e, buffer) for e in (s.image, s.channel0, s.row0))
    if isinstance(s, Winograd):
        return buffer in (s.x, s.u, s.v, s.m, s.c) or any(reads(e, buffer) for e in (s.image, s.row0, s.k0))
    if isinstance(s, ReduceTile):
        return buffer in (s.src, s.dst)
    if isinstance(s, Copy):
        return buffer in (s.src.buffer, s.dst.buffer)
    if isinstance(s, If):
        return reads(s.cond, buffer) or any(stmt_reads(x, buffer) for x in s.body)
    if isinstance(s, Store):
        return any(reads(e, buffer) for e in (s.value, *s.indices))
    return False


def mentions(e: Expr, v: Var) -> bool:
    return any(x == v for x in subexpressions(e))


def offset_of(e: Expr, v: Var) -> Expr | None:
    """``o`` where ``e`` is ``v``, ``v + o`` or ``o + v`` with ``o`` free of ``v``."""
    if e == v:
        return Const(0, DType.INT64)
    if isinstance(e, IndexOp) and e.op is IOp.ADD:
        if e.a == v and not mentions(e.b, v):
            return e.b
        if e.b == v and not mentions(e.a, v):
            return e.a
    return None


def rectangle(indices: tuple[Expr, ...], loops: list[Loop]) -> list[tuple[Expr, int | None]] | None:
    """``indices`` as a rectangle over the nest ``loops``: leading indices free of the loop
    variables (each ``(index, None)``), then each variable once, in order, plus an offset
    free of them (``(offset, extent)``); None where they are not such a rectangle."""
    names = [l.var for l in loops]
    fixed = True
    parts: list[tuple[Expr, int | None]] = []
    for idx in indices:
        used = [v for v in names if mentions(idx, v)]
        if not used:
            if not fixed:
                return None  # a fixed index after a tiled one
            parts.append((idx, None))
            continue
        fixed = False
        off = offset_of(idx, used[0]) if len(used) == 1 else None
        if off is None or not names or used[0] != names[0]:
            return None
        names = names[1:]
        parts.append((off, loops[len(loops) - len(names) - 1].extent))
    return None if names else parts
