"""Parallel nests of a tile program: the unit a block's threads are split over.

A parallel loop and the parallel loops directly nested in it form one nest (one
``T.Parallel`` on the GPU); its iterations are the product of their extents. The thread
fitting pass, the verifier and the CUDA printer all reason about nests, so they read
them from here.
"""
from __future__ import annotations

import math

from tilefuse.tile_ir.ir import If, Load, Loop, LoopKind, Scope, Stmt, Store, statements, subexpressions


def parallel_nest(s: Loop) -> list[Loop]:
    """``s`` and the parallel loops directly nested in it: one nest."""
    loops = [s]
    while len(loops[-1].body) == 1 and isinstance(loops[-1].body[0], Loop) and loops[-1].body[0].kind is LoopKind.PARALLEL:
        loops.append(loops[-1].body[0])
    return loops


def parallel_totals(stmts: tuple[Stmt, ...], registers: bool = False) -> list[int]:
    """Iterations of each parallel nest in ``stmts``, outer nests before inner ones;
    ``registers``: only the nests that read or write a fragment buffer (a per-thread
    register tile's candidates)."""
    out: list[int] = []
    for s in stmts:
        if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL:
            nest = parallel_nest(s)
            if not registers or _touches_fragment(nest[-1].body):
                out.append(math.prod(l.extent for l in nest))
            out += parallel_totals(nest[-1].body, registers)
        elif isinstance(s, (Loop, If)):
            out += parallel_totals(s.body, registers)
    return out


def uneven_nests(stmts: tuple[Stmt, ...], threads: int) -> list[int]:
    """The nests over fragment buffers at least ``threads`` long that ``threads`` does not
    divide: TileLang lays a register tile out over a block's threads evenly, so a block
    of that many threads has no layout for them. Nests over shared and global memory
    only split unevenly (TileLang guards the last threads' iterations)."""
    return [n for n in parallel_totals(stmts, registers=True) if n >= threads and n % threads]


def _touches_fragment(stmts: tuple[Stmt, ...]) -> bool:
    """Whether a store or a load in ``stmts`` (nested loops and branches included) is of a
    fragment buffer."""
    for s in statements(stmts):
        if isinstance(s, Store):
            buffers, exprs = [s.buffer], (s.value, *s.indices)
        elif isinstance(s, If):
            buffers, exprs = [], (s.cond,)
        else:
            continue
        buffers += [e.buffer for x in exprs for e in subexpressions(x) if isinstance(e, Load)]
        if any(b.scope is Scope.FRAGMENT for b in buffers):
            return True
    return False
