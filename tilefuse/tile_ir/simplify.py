"""Index simplification: turn the addressing that lowering composes (reshape after
transpose after reshape ...) back into plain arithmetic.

Expressions are put in linear form (a sum of coefficient x atom plus a constant) and
bounded by interval arithmetic over the loop and block variables' ranges. Then
``(n*q + r) // n = q`` and ``(n*q + r) % n = r`` whenever ``0 <= r < n`` — the identity
behind every reshape round trip — and ``a % n = a``, ``a // n = 0`` for ``0 <= a < n``.
Comparisons the bounds decide fold to constants, and so do the guards built of them: a
window that never leaves its input loses its bounds checks.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import (
    Call,
    Const,
    Copy,
    Expr,
    If,
    IndexCheck,
    IndexOp,
    IOp,
    Load,
    Loop,
    PanelGemm,
    PlaneTaps,
    Region,
    Stmt,
    Store,
    StridedGemm,
    TapGemm,
    TileProgram,
    Transpose,
    Var,
    Winograd,
    const_index,
    iop,
)

Bounds = tuple[int, int]  # inclusive
INF = 1 << 62

# comparisons the bounds decide: True, False, or None when the ranges overlap
_COMPARE = {
    IOp.LT: lambda a, b: True if a[1] < b[0] else (False if a[0] >= b[1] else None),
    IOp.LE: lambda a, b: True if a[1] <= b[0] else (False if a[0] > b[1] else None),
    IOp.GE: lambda a, b: True if a[0] >= b[1] else (False if a[1] < b[0] else None),
}


class _Simplifier:
    def __init__(self, ranges: Mapping[str, int]) -> None:
        self.ranges = dict(ranges)
        self.memo: dict[Expr, Expr] = {}

    # -- bounds -------------------------------------------------------------------------
    def bounds(self, e: Expr) -> Bounds:
        if isinstance(e, Const) and e.dtype is DType.INT64:
            return int(e.value), int(e.value)
        if isinstance(e, Var):
            n = self.ranges.get(e.name)
            return (0, n - 1) if n else (-INF, INF)
        if isinstance(e, IndexCheck):
            return 0, e.extent - 1
        if isinstance(e, IndexOp):
            (a0, a1), (b0, b1) = self.bounds(e.a), self.bounds(e.b)
            if e.op is IOp.ADD:
                return a0 + b0, a1 + b1
            if e.op is IOp.SUB:
                return a0 - b1, a1 - b0
            if e.op is IOp.MUL:
                c = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
                return min(c), max(c)
            if e.op is IOp.FLOORDIV and b0 == b1 and b0 > 0:
                return a0 // b0, a1 // b0
            if e.op is IOp.MOD and b0 == b1 and b0 > 0:
                return (a0, a1) if 0 <= a0 and a1 < b0 else (0, b0 - 1)
            if e.op is IOp.MIN:
                return min(a0, b0), min(a1, b1)
            if e.op is IOp.MAX:
                return max(a0, b0), max(a1, b1)
        return -INF, INF

    # -- linear forms -------------------------------------------------------------------
    def linear(self, e: Expr) -> tuple[dict[Expr, int], int]:
        if isinstance(e, Const) and e.dtype is DType.INT64:
            return {}, int(e.value)
        if isinstance(e, IndexOp) and e.op in (IOp.ADD, IOp.SUB):
            ta, ca = self.linear(e.a)
            tb, cb = self.linear(e.b)
            sign = 1 if e.op is IOp.ADD else -1
            out = dict(ta)
            for k, v in tb.items():
                out[k] = out.get(k, 0) + sign * v
            return self._fuse_divmod({k: v for k, v in out.items() if v}, ca + sign * cb)
        if isinstance(e, IndexOp) and e.op is IOp.MUL:
            for x, y in ((e.a, e.b), (e.b, e.a)):
                if isinstance(y, Const):
                    t, c = self.linear(x)
                    factor = int(y.value)
                    return {a: v * factor for a, v in t.items() if v * factor}, c * factor
        return {e: 1}, 0

    def _fuse_divmod(self, terms: dict[Expr, int], const: int) -> tuple[dict[Expr, int], int]:
        """``k*n*(x // n) + k*(x % n)`` is ``k*x``: a reshape's split undone."""
        changed = True
        while changed:
            changed = False
            for atom, coef in list(terms.items()):
                if not (isinstance(atom, IndexOp) and atom.op is IOp.FLOORDIV and isinstance(atom.b, Const)):
                    continue
                n = int(atom.b.value)
                split = self._split_divisor(terms, atom, coef, n)
                if split is not None:  # c*(x // (d*m)) + (c/m)*((x // d) % m) = (c/m)*(x // d)
                    terms = split
                    changed = True
                    break
                mod = IndexOp(IOp.MOD, atom.a, atom.b)
                if n > 0 and coef % n == 0 and terms.get(mod) == coef // n:
                    k = coef // n
                    del terms[atom], terms[mod]
                    inner, c = self.linear(atom.a)
                    for a, v in inner.items():
                        terms[a] = terms.get(a, 0) + k * v
                    terms = {a: v for a, v in terms.items() if v}
                    const += k * c
                    changed = True
                    break
        return terms, const

    @staticmethod
    def _split_divisor(terms: dict[Expr, int], atom: IndexOp, coef: int, n: int) -> dict[Expr, int] | None:
        """Merge ``coef * (x // n)`` with ``coef/m * ((x // d) % m)`` for some n = d * m:
        delinearising through an inner stride d leaves such pairs (a reshape of a reshape)."""
        for d in range(2, n):
            if n % d:
                continue
            m = n // d
            inner = IndexOp(IOp.FLOORDIV, atom.a, const_index(d))
            mod = IndexOp(IOp.MOD, inner, const_index(m))
            if coef % m == 0 and terms.get(mod) == coef // m:
                out = {k: v for k, v in terms.items() if k != atom and k != mod}
                out[inner] = out.get(inner, 0) + coef // m
                return {k: v for k, v in out.items() if v}
        return None

    def rebuild(self, terms: Mapping[Expr, int], const: int) -> Expr:
        out: Expr = const_index(0)
        for atom, coef in sorted(terms.items(), key=lambda kv: repr(kv[0])):
            out = iop(IOp.ADD, out, iop(IOp.MUL, atom, coef))
        return iop(IOp.ADD, out, const)

    def split(self, e: Expr, n: int) -> tuple[Expr, Expr] | None:
        """(q, r) with e = n*q + r and 0 <= r < n, when the linear form shows them."""
        terms, const = self.linear(e)
        q_terms = {a: c // n for a, c in terms.items() if c % n == 0}
        r_terms = {a: c for a, c in terms.items() if c % n != 0}
        r = self.rebuild(r_terms, const % n)
        lo, hi = self.bounds(r)
        if 0 <= lo and hi < n:
            return self.rebuild(q_terms, const // n), r
        return None

    # -- the rewrite --------------------------------------------------------------------
    def expr(self, e: Expr) -> Expr:
        if e in self.memo:
            return self.memo[e]
        out = self._expr(e)
        self.memo[e] = out
        return out

    def _expr(self, e: Expr) -> Expr:
        if isinstance(e, IndexOp):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in (IOp.FLOORDIV, IOp.MOD) and isinstance(b, Const) and int(b.value) > 0:
                n = int(b.value)
                qr = self.split(a, n)
                if qr is not None:
                    return self.expr(qr[0]) if e.op is IOp.FLOORDIV else self.expr(qr[1])
            if e.op in (IOp.ADD, IOp.SUB, IOp.MUL):
                terms, const = self.linear(iop(e.op, a, b))
                return self.rebuild(terms, const)
            if e.op in _COMPARE:
                known = _COMPARE[e.op](self.bounds(a), self.bounds(b))
                if known is not None:
                    return Const(known, DType.BOOL)
            if e.op in (IOp.AND, IOp.OR):
                for x, y in ((a, b), (b, a)):
                    if isinstance(x, Const) and x.dtype is DType.BOOL:
                        # AND: true drops out, false decides; OR: the other way round
                        return y if bool(x.value) == (e.op is IOp.AND) else x
            return iop(e.op, a, b)
        if isinstance(e, Load):
            return Load(e.buffer, tuple(self.expr(i) for i in e.indices))
        if isinstance(e, Call):
            cond = self.expr(e.args[0]) if e.fn is ScalarFn.WHERE else None
            if isinstance(cond, Const) and cond.dtype is DType.BOOL:  # a guard always true (or false)
                return self.expr(e.args[1] if cond.value else e.args[2])
            return Call(e.fn, tuple(self.expr(x) for x in e.args), e.dtype)
        if isinstance(e, IndexCheck):
            return IndexCheck(self.expr(e.index), e.extent, e.site)
        return e

    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, Loop):
            self.ranges[s.var.name] = s.extent
            self.memo.clear()
            body = tuple(self.stmt(b) for b in s.body)
            self.ranges.pop(s.var.name, None)
            self.memo.clear()
            return replace(s, body=body)
        if isinstance(s, Store):
            return Store(s.buffer, tuple(self.expr(i) for i in s.indices), self.expr(s.value))
        if isinstance(s, If):
            return If(self.expr(s.cond), tuple(self.stmt(b) for b in s.body))
        if isinstance(s, Copy):
            return Copy(self._region(s.src), self._region(s.dst), s.bulk)
        if isinstance(s, PanelGemm):
            return replace(s, a=self._region(s.a), panel0=self.expr(s.panel0), k0=self.expr(s.k0),
                           columns=None if s.columns is None else self.expr(s.columns))
        if isinstance(s, StridedGemm):
            return replace(s, a=self._region(s.a), b=self._region(s.b))
        if isinstance(s, TapGemm):
            return replace(s, a=self._region(s.a))
        if isinstance(s, Transpose):
            return Transpose(self._region(s.src), self._region(s.dst))
        if isinstance(s, Winograd):
            return replace(s, image=self.expr(s.image), row0=self.expr(s.row0), k0=self.expr(s.k0))
        if isinstance(s, PlaneTaps):
            return replace(s, image=self.expr(s.image), channel0=self.expr(s.channel0), row0=self.expr(s.row0))
        return s

    def _region(self, r: Region) -> Region:
        return Region(r.buffer, tuple(self.expr(o) for o in r.offsets), r.extents)


def simplify_program(p: TileProgram) -> TileProgram:
    """The same program with its index arithmetic simplified (semantics unchanged)."""
    s = _Simplifier({v.name: g for v, g in zip(p.block_vars, p.grid)})
    return replace(p, body=tuple(s.stmt(x) for x in p.body))


def simplify_expr(e: Expr, ranges: Mapping[str, int]) -> Expr:
    """``e`` simplified, its variables ranging over ``[0, ranges[name])``."""
    return _Simplifier(ranges).expr(e)
