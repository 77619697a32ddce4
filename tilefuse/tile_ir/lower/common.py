"""Pieces every schedule uses: loop nests, reductions' combine and identity, casts,
tile sizes."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tilefuse.ir.dtypes import HALF_FLOATS, DType
from tilefuse.ir.prims import ReduceFn, ScalarFn, ScatterReduction
from tilefuse.tile_ir.ir import Call, Const, Expr, IOp, Loop, LoopKind, Stmt, Var, dtype_of, iop, subexpressions


class Names:
    def __init__(self) -> None:
        self.n = 0

    def var(self, hint: str) -> Var:
        self.n += 1
        return Var(f"{hint}{self.n}")


def accumulator_dtype(dtype: DType) -> DType:
    return DType.FLOAT32 if dtype in HALF_FLOATS else dtype


def parallel(names: Names, shape: Sequence[int], body_of) -> tuple[Stmt, ...]:
    """A nest of parallel loops over ``shape``; ``body_of(index)`` gives the body."""
    vars_ = [names.var("i") for _ in shape]
    body: tuple[Stmt, ...] = tuple(body_of(tuple(vars_)))
    for v, d in reversed(list(zip(vars_, shape))):
        body = (Loop(v, d, LoopKind.PARALLEL, body),)
    return body


def serial(names: Names, shape: Sequence[int], body_of) -> tuple[Stmt, ...]:
    vars_ = [names.var("k") for _ in shape]
    body: tuple[Stmt, ...] = tuple(body_of(tuple(vars_)))
    for v, d in reversed(list(zip(vars_, shape))):
        body = (Loop(v, d, LoopKind.SERIAL, body),)
    return body


COMBINE = {ReduceFn.SUM: ScalarFn.ADD, ReduceFn.PROD: ScalarFn.MUL, ReduceFn.MAX: ScalarFn.MAX, ReduceFn.MIN: ScalarFn.MIN}
_SCATTER_COMBINE = {ScatterReduction.ADD: ScalarFn.ADD, ScatterReduction.MUL: ScalarFn.MUL,
                    ScatterReduction.MAX: ScalarFn.MAX, ScatterReduction.MIN: ScalarFn.MIN}


def scatter_combine(reduction: ScatterReduction, old: Expr, new: Expr, dtype: DType) -> Expr:
    """What a scatter writes where an update lands: the update, or it combined with what
    is there (ScatterND / ScatterElements' ``reduction``)."""
    return new if reduction is ScatterReduction.NONE else Call(_SCATTER_COMBINE[reduction], (old, new), dtype)


def identity(fn: ReduceFn, dtype: DType) -> Const:

    return Const(np.asarray(fn.identity(dtype.numpy)).astype(dtype.numpy).item(), dtype)


TILE_M, TILE_N, TILE_K = 64, 64, 256


def guard_all(conds: list[Expr], val: Expr, dtype: DType) -> Expr:
    if not conds:
        return val
    cond = conds[0]
    for c in conds[1:]:
        cond = iop(IOp.AND, cond, c)
    return Call(ScalarFn.WHERE, (cond, val, Const(0, dtype)), dtype)


def widen(e: Expr, dtype: DType) -> Expr:
    return e if dtype_of(e) is dtype else Call(ScalarFn.CAST, (e,), dtype)


def narrow(e: Expr, dtype: DType) -> Expr:
    """``e`` as ``dtype`` for a tile of that type: undoes a widening cast instead of
    stacking a second one on it."""
    if dtype_of(e) is dtype:
        return e
    if isinstance(e, Call) and e.fn is ScalarFn.CAST and dtype_of(e.args[0]) is dtype:
        return e.args[0]
    return Call(ScalarFn.CAST, (e,), dtype)


def fill_cores(extents: tuple[int, ...], tiles: list[int], lead: int, cores: int, floor: int) -> list[int]:
    """Tile edges for ``extents`` (starting from ``tiles``), halved (as divisors) from the
    largest edge down, while the grid of ``lead`` x the tiles leaves some of ``cores``
    idle and an edge stays at least ``floor``: batch-1 layers on a GPU of 132 SMs."""
    tiles = list(tiles)
    while lead * math.prod(e // t for e, t in zip(extents, tiles)) < cores:
        for d in sorted(range(len(tiles)), key=lambda d: -tiles[d]):
            smaller = divisor_tile(extents[d], tiles[d] // 2) if tiles[d] > 1 else tiles[d]
            if floor <= smaller < tiles[d]:
                tiles[d] = smaller
                break
        else:
            return tiles
    return tiles


def halve_while_idle(extent: int, tile: int, lead: int, cores: int, floor: int) -> int:
    """A power-of-two ``tile`` over ``extent`` (the last tile partial), halved while ``lead``
    x its tiles leave some of ``cores`` idle and it stays above ``floor``."""
    while tile > floor and lead * -(-extent // tile) < cores:
        tile //= 2
    return tile


def divisor_tile(n: int, cap: int) -> int:
    """The largest divisor of n not above cap (tiles without tails)."""
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def even_divisor(n: int, cap: int, times: int, threads: int) -> int:
    """The divisor ``d`` of ``n`` up to ``cap`` whose tile of ``d * times`` elements the most
    threads (a power of two, up to ``threads``) split evenly; then the largest (thread
    fitting would otherwise narrow the block to divide the tile's nests)."""
    return max((d for d in range(1, min(n, cap) + 1) if n % d == 0),
               key=lambda d: (min((d * times) & -(d * times), threads), d))


def var_ids(e: Expr) -> set[int]:
    """The variables ``e`` mentions (by id): which loop an index follows, for schedules
    that order a nest so neighbouring threads touch neighbouring elements."""
    return {id(x) for x in subexpressions(e) if isinstance(x, Var)}
