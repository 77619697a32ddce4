"""Cheaper forms of scalar expressions on CUDA, as tile IR the emitter renders like any
other expression (a subexpression used more than once becomes a let).

``1 + erf(u)``, the exact GELU's ``x/2 (1 + erf(x/sqrt 2))``: CUDA's erff evaluates one of
two degree-6 polynomials picked by selects, then an exponential for |u| >= ~1 (~26
instructions with the sum). Where the result is added to 1, only erf's absolute error
counts, so it is taken as ``1 + sign(u) (1 - erfc(|u|))`` with erfc from Abramowitz and
Stegun 7.1.26: ``t P(t) exp(-u^2)``, ``t = 1 / (1 + p |u|)``, absolute error <= 1.5e-7 on
erf (the same order as erff's 2 ulp near 1). The reciprocal and exponential are the
hardware's approximations (rcp.approx, ex2.approx), ~15 instructions in all. In bert's
FFN-up kernel this is the epilogue's cost: 128 elements a thread after the last product.
"""
from __future__ import annotations

from dataclasses import dataclass

from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Call, Const, Expr, IndexOp, Load

F32 = DType.FLOAT32
FLOATS = {DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16}
ERFC_P = 0.3275911
ERFC_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


@dataclass(frozen=True, slots=True)
class Intrinsic(Expr):
    """A float32 CUDA function: one of TileLang's language (``T.__exp``: __expf,
    ``T.copysign``), or with ``extern`` a CUDA device function called by name
    (``__fdividef``: rcp.approx and a product; TileLang's T.fast_rcp is volatile asm,
    which nvcc will not share between uses)."""

    name: str
    args: tuple[Expr, ...]
    extern: bool = False


def erf_plus_one(u: Expr) -> Expr:
    """``1 + erf(u)`` for float32 ``u`` (see the module docstring)."""
    def f(fn: ScalarFn, *args: Expr) -> Call:
        return Call(fn, args, F32)

    a = f(ScalarFn.ABS, u)
    t = Intrinsic("__fdividef", (Const(1.0, F32), f(ScalarFn.ADD, Const(1.0, F32), f(ScalarFn.MUL, Const(ERFC_P, F32), a))),
                  extern=True)
    poly: Expr = Const(ERFC_A[4], F32)
    for c in reversed(ERFC_A[:4]):
        poly = f(ScalarFn.ADD, Const(c, F32), f(ScalarFn.MUL, t, poly))
    erfc = f(ScalarFn.MUL, f(ScalarFn.MUL, t, poly), Intrinsic("__exp", (f(ScalarFn.NEG, f(ScalarFn.MUL, a, a)),)))
    erf = Intrinsic("copysign", (f(ScalarFn.SUB, Const(1.0, F32), erfc), u))
    return f(ScalarFn.ADD, Const(1.0, F32), erf)


def fast_forms(e: Expr) -> Expr:
    """``e`` with every float ``erf(u) + 1`` (either order) in its cheaper form, in
    float32 (a half sum is rounded once, at the end); the same object where nothing
    changes."""
    memo: dict[int, Expr] = {}

    def visit(x: Expr) -> Expr:
        if id(x) in memo:
            return memo[id(x)]
        out = x
        if isinstance(x, Call):
            args = tuple(visit(a) for a in x.args)
            erf = _erf_of_sum(x.fn, args, x.dtype)
            if erf is not None and x.dtype is F32:
                out = erf_plus_one(erf)
            elif erf is not None:  # half: evaluated in float32, as TileLang evaluates half erf
                out = Call(ScalarFn.CAST, (erf_plus_one(Call(ScalarFn.CAST, (erf,), F32)),), x.dtype)
            elif any(n is not o for n, o in zip(args, x.args)):
                out = Call(x.fn, args, x.dtype)
        elif isinstance(x, IndexOp):
            a, b = visit(x.a), visit(x.b)
            out = x if a is x.a and b is x.b else IndexOp(x.op, a, b)
        elif isinstance(x, Load):
            idx = tuple(visit(i) for i in x.indices)
            out = x if all(n is o for n, o in zip(idx, x.indices)) else Load(x.buffer, idx)
        memo[id(x)] = out
        return out

    return visit(e)


def _erf_of_sum(fn: ScalarFn, args: tuple[Expr, ...], dtype: DType) -> Expr | None:
    """The erf argument of a float ``erf(u) + 1`` or ``1 + erf(u)``, else None."""
    if fn is not ScalarFn.ADD or dtype not in FLOATS:
        return None
    for erf, one in (args, args[::-1]):
        if isinstance(erf, Call) and erf.fn is ScalarFn.ERF and erf.dtype is dtype \
                and isinstance(one, Const) and one.value == 1:
            return erf.args[0]
    return None
