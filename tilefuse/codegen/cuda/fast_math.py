"""Cheaper forms of scalar expressions on CUDA, as calls of tilefuse's device functions
(``include/tilefuse_math.cuh``, included ahead of every kernel).

``1 + erf(u)``, the exact GELU's ``x/2 (1 + erf(x/sqrt 2))``: CUDA's erff evaluates one of
two degree-6 polynomials picked by selects, then an exponential (~26 instructions with the
sum). Where the result is added to 1 only erf's absolute error counts, so it is taken as
``1 + sign(u) (1 - erfc(|u|))`` with erfc from Abramowitz and Stegun 7.1.26 (absolute error
<= 1.5e-7 on erf, the same order as erff's 2 ulp near 1) and the hardware's reciprocal and
exponential approximations: ~15 instructions. In bert's FFN-up kernel this is the
epilogue's cost (128 elements a thread after the last product). A device function, not an
expression tree: TileLang inlines the emitter's lets, so an argument used several times in
the formula would be recomputed (and nvcc does not share half-float operations, which are
inline asm); a call evaluates it once.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Call, Const, Expr, IndexOp, Load

HEADER = Path(__file__).parent / "include" / "tilefuse_math.cuh"
F32 = DType.FLOAT32
FLOATS = {DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16}


@dataclass(frozen=True, slots=True)
class DeviceCall(Expr):
    """A float32 device function of HEADER, called by name (``T.call_extern``)."""

    name: str
    args: tuple[Expr, ...]


def fast_forms(e: Expr) -> Expr:
    """``e`` with every float ``erf(u) + 1`` (either order) as ``tf_erf_plus_one(u)``, in
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
            if erf is not None:
                u = erf if x.dtype is F32 else Call(ScalarFn.CAST, (erf,), F32)
                out = DeviceCall("tf_erf_plus_one", (u,))
                if x.dtype is not F32:  # half: evaluated in float32, as TileLang evaluates half erf
                    out = Call(ScalarFn.CAST, (out,), x.dtype)
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
