"""Buffer accesses printed at one flat offset, where that cancels index arithmetic.

C addresses a buffer at one offset, ``sum(index[d] * stride[d])``; the tile IR indexes it
per dim. A loop over a tile's positions as one run (``q`` over rows x W, a channel's
plane in a channel-rows epilogue) reads and writes its NCHW tensors at ``(.., row0 + q //
W, q % W)``: per dim, the printer would print a division and a remainder for every
element, and GCC neither cancels them in the offset nor vectorises the loop. Linearised
first, ``(q // W) * W + q % W`` is ``q`` (``tile_ir.simplify``'s div/mod fusion), and the
access is a plain run.

``flatten_accesses`` rewrites a Load's or Store's indices as zeros and the flat offset
where they divide the innermost loop's variable (what runs per element) and the flat
form has fewer divisions and remainders; every other access is left as it is (a division
of an outer loop's variable is hoisted out of the inner loops as it is: flattening an
im2col fill's reads by it halved that kernel's speed), so a program without such indices
prints exactly as before. The result is for the printer only (``flat_index`` of it is the
same address): its indices are no longer each within their dim.
"""
from __future__ import annotations

from dataclasses import replace

from tilefuse.tile_ir.ir import (Buffer, Call, Const, Expr, If, IndexCheck, IndexOp, IOp, Load, Loop, Stmt, Store, TileProgram, Var,
                                 const_index, iop, map_loads, subexpressions)
from tilefuse.tile_ir.nests import mentions
from tilefuse.tile_ir.simplify import simplify_expr


def flatten_accesses(p: TileProgram) -> TileProgram:
    return replace(p, body=tuple(_stmt(s, None) for s in p.body))


def _stmt(s: Stmt, inner: Var | None) -> Stmt:
    if isinstance(s, Loop):
        return replace(s, body=tuple(_stmt(x, s.var) for x in s.body))
    if isinstance(s, If):
        return If(_expr(s.cond, inner), tuple(_stmt(x, inner) for x in s.body))
    if isinstance(s, Store) and inner is not None:
        value = _expr(s.value, inner)
        indices = _flat(s.buffer, s.indices, inner)
        # a store made a run while the loop reads something strided along it (a tile read
        # transposed): GCC would vectorise it with gathers, slower than the scalar loop
        if indices is not s.indices and any(_stride(x, inner) not in (0, 1) for x in _loads(value)):
            return s
        return Store(s.buffer, indices, value)
    return s


def _loads(e: Expr) -> list[Load]:
    return [x for x in subexpressions(e) if isinstance(x, Load)]


def _stride(load: Load, v: Var) -> int | None:
    """How far ``load``'s flat offset moves from ``v`` = 0 to 1 (every other variable 0),
    None where that depends on data."""
    offset = 0
    for i, n in zip(load.indices, load.buffer.shape):
        at0, at1 = _value(i, v, 0), _value(i, v, 1)
        if at0 is None or at1 is None:
            return None
        offset = offset * n + (at1 - at0)
    return offset


def _value(e: Expr, v: Var, x: int) -> int | None:
    if isinstance(e, Var):
        return x if e == v else 0
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, IndexOp):
        a, b = _value(e.a, v, x), _value(e.b, v, x)
        if a is None or b is None:
            return None
        ops = {IOp.ADD: lambda: a + b, IOp.SUB: lambda: a - b, IOp.MUL: lambda: a * b, IOp.MIN: lambda: min(a, b),
               IOp.MAX: lambda: max(a, b), IOp.FLOORDIV: lambda: a // b if b else None, IOp.MOD: lambda: a % b if b else None}
        return ops[e.op]() if e.op in ops else None
    return None


def _expr(e: Expr, inner: Var | None) -> Expr:
    return map_loads(e, lambda x: Load(x.buffer, _flat(x.buffer, x.indices, inner)))


def _flat(buffer: Buffer, indices: tuple[Expr, ...], inner: Var | None) -> tuple[Expr, ...]:
    """``indices`` as zeros and their flat offset where they divide ``inner`` and that
    drops divisions or remainders, else as they are."""
    before = sum(_divmods(i) for i in indices)
    if len(indices) < 2 or not before or inner is None or not any(_divides(i, inner) for i in indices):
        return indices
    offset: Expr = const_index(0)
    for i, n in zip(indices, buffer.shape):
        offset = iop(IOp.ADD, iop(IOp.MUL, offset, n), i)
    flat = simplify_expr(offset, {})
    if _divmods(flat) >= before:
        return indices
    return (*(const_index(0) for _ in indices[:-1]), flat)


def _divides(e: Expr, v: Var) -> bool:
    """Whether ``e`` holds a division or remainder of an expression of ``v``."""
    return any(isinstance(x, IndexOp) and x.op in (IOp.FLOORDIV, IOp.MOD) and mentions(x.a, v) for x in subexpressions(e))


def _divmods(e: Expr) -> int:
    if isinstance(e, IndexOp):
        return int(e.op in (IOp.FLOORDIV, IOp.MOD)) + _divmods(e.a) + _divmods(e.b)
    if isinstance(e, Load):
        return 0  # an index read from memory is an atom of the offset
    if isinstance(e, Call):
        return sum(_divmods(x) for x in e.args)
    if isinstance(e, IndexCheck):
        return _divmods(e.index)
    return 0
