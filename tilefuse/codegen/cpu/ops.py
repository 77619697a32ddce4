"""C text for one scalar operation, given the C text of its operands.

Operands arrive already in their compute types (see ``c_types``) and each is used once in
the result (helpers take the operands that a plain C form would repeat), so operand text
may be any expression. Semantics are those of ``tilefuse.ir.prims.map.ScalarFn`` and of
the tile IR's ``IOp`` (see ``tilefuse.tile_ir.interpret``).
"""
from __future__ import annotations

import re
from typing import Sequence

from tilefuse.codegen.cpu.c_types import compute, convert, literal, round_to, unsigned_wide
from tilefuse.ir.dtypes import HALF_FLOATS, DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import IOp

_LIBM = {
    ScalarFn.SQRT: "sqrt", ScalarFn.EXP: "exp", ScalarFn.LOG: "log", ScalarFn.FLOOR: "floor",
    ScalarFn.CEIL: "ceil", ScalarFn.ROUND: "rint", ScalarFn.ERF: "erf", ScalarFn.TANH: "tanh",
    ScalarFn.SIN: "sin", ScalarFn.COS: "cos", ScalarFn.TAN: "tan", ScalarFn.ASIN: "asin", ScalarFn.ACOS: "acos",
    ScalarFn.ATAN: "atan", ScalarFn.SINH: "sinh", ScalarFn.COSH: "cosh", ScalarFn.ASINH: "asinh",
    ScalarFn.ACOSH: "acosh", ScalarFn.ATANH: "atanh",
}  # rint rounds half to even in the default rounding mode, as ONNX Round does
# float32 forms in the prelude that vectorise (libm's are opaque calls): within a few ulp of libm
_VECTOR = {ScalarFn.EXP: "tf_exp_f32", ScalarFn.TANH: "tf_tanh_f32", ScalarFn.ERF: "tf_erf_f32"}
_INFIX = {ScalarFn.ADD: "+", ScalarFn.SUB: "-", ScalarFn.MUL: "*", ScalarFn.DIV: "/"}
_COMPARE = {ScalarFn.EQ: "==", ScalarFn.LT: "<", ScalarFn.LE: "<=", ScalarFn.GT: ">", ScalarFn.GE: ">="}
_BITWISE = {ScalarFn.BITAND: "&", ScalarFn.BITOR: "|", ScalarFn.BITXOR: "^"}
# Functions whose result on half-float inputs is again a half value (no rounding needed).
_EXACT_ON_HALF = {ScalarFn.NEG, ScalarFn.ABS, ScalarFn.SIGN, ScalarFn.FLOOR, ScalarFn.CEIL, ScalarFn.ROUND,
                  ScalarFn.MAX, ScalarFn.MIN, ScalarFn.WHERE}


class UnsupportedScalar(ValueError):
    """A scalar function / dtype combination the C emitter has no rule for."""


def render_call(fn: ScalarFn, args: Sequence[str], dtypes: Sequence[DType], out: DType) -> str:
    """``fn(args)`` producing a compute-type value of ``out``."""
    if fn is ScalarFn.CAST:
        return convert(args[0], dtypes[0], out)
    if fn is ScalarFn.WHERE:
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if fn in _COMPARE:
        return f"({args[0]} {_COMPARE[fn]} {args[1]})"
    if fn in (ScalarFn.AND, ScalarFn.OR, ScalarFn.XOR, ScalarFn.NOT, ScalarFn.ISNAN, ScalarFn.ISINF):
        return _logic(fn, args)
    d = dtypes[0]
    if d.is_float:
        text = _float(fn, args, dtypes, d)
        return text if fn in _EXACT_ON_HALF or d not in HALF_FLOATS else round_to(d, text)
    if d is DType.BOOL:
        return _bool(fn, args)
    return f"({compute(out)})({_int(fn, args, dtypes, d)})"


def _logic(fn: ScalarFn, a: Sequence[str]) -> str:
    if fn is ScalarFn.AND:
        return f"({a[0]} && {a[1]})"
    if fn is ScalarFn.OR:
        return f"({a[0]} || {a[1]})"
    if fn is ScalarFn.XOR:
        return f"(!({a[0]}) != !({a[1]}))"
    if fn is ScalarFn.NOT:
        return f"(!({a[0]}))"
    return f"(isnan({a[0]}) != 0)" if fn is ScalarFn.ISNAN else f"(isinf({a[0]}) != 0)"


def _float(fn: ScalarFn, a: Sequence[str], dtypes: Sequence[DType], d: DType) -> str:
    sfx = "" if d is DType.FLOAT64 else "f"
    w = "f64" if d is DType.FLOAT64 else "f32"
    if fn in _INFIX:
        return f"({a[0]} {_INFIX[fn]} {a[1]})"
    if fn in _VECTOR and d is not DType.FLOAT64:
        return f"{_VECTOR[fn]}({a[0]})"
    if fn in _LIBM:
        return f"{_LIBM[fn]}{sfx}({a[0]})"
    simple = {
        ScalarFn.NEG: f"(-{a[0]})", ScalarFn.ABS: f"fabs{sfx}({a[0]})",
        ScalarFn.RECIPROCAL: f"({literal(1, d)} / {a[0]})", ScalarFn.SIGMOID: f"tf_sigmoid_{w}({a[0]})",
        ScalarFn.SIGN: f"tf_sign_{w}({a[0]})",
    }
    if fn in simple:
        return simple[fn]
    if fn in (ScalarFn.MAX, ScalarFn.MIN):
        # an operand that is a constant, never NaN (ReLU's 0, Clip's bounds): a form of one
        # compare and one select (the prelude's), equal to the general one
        name = fn.name.lower()
        if _ordered_literal(a[1]):
            name += "k"
        elif _ordered_literal(a[0]):
            name = "k" + name
        return f"tf_{name}_{w}({a[0]}, {a[1]})"
    if fn is ScalarFn.MOD:
        return f"tf_mod_{w}({a[0]}, {a[1]})"
    if fn is ScalarFn.FMOD:
        return f"fmod{sfx}({a[0]}, {a[1]})"
    if fn is ScalarFn.POW:  # the exponent takes the base's dtype first, as numpy's power does
        exp = a[1] if dtypes[1] is d else convert(a[1], dtypes[1], DType.FLOAT64 if sfx == "" else DType.FLOAT32)
        return f"pow{sfx}({a[0]}, {exp})"
    raise UnsupportedScalar(f"{fn.name} on {d}")


# a float literal as ``c_types.literal`` prints it, NaN excepted: 1.5f, (-2.0f), 1e-05, INFINITY
_ORDERED = re.compile(r"\(?-?(?:\d+(?:\.\d*)?(?:e[+-]?\d+)?f?|INFINITY|\(\(double\)INFINITY\))\)?")


def _ordered_literal(text: str) -> bool:
    """Whether ``text`` is a float constant that is never NaN."""
    return _ORDERED.fullmatch(text) is not None


def _bool(fn: ScalarFn, a: Sequence[str]) -> str:
    table = {
        ScalarFn.ADD: "||", ScalarFn.MAX: "||", ScalarFn.BITOR: "||", ScalarFn.MUL: "&&", ScalarFn.MIN: "&&",
        ScalarFn.BITAND: "&&", ScalarFn.SUB: "!=", ScalarFn.BITXOR: "!=",
    }
    if fn in table:
        return f"(({a[0]} != 0) {table[fn]} ({a[1]} != 0))"
    if fn is ScalarFn.BITNOT:
        return f"(!({a[0]}))"
    if fn in (ScalarFn.ABS, ScalarFn.SIGN):
        return a[0]
    raise UnsupportedScalar(f"{fn.name} on bool")


def _int(fn: ScalarFn, a: Sequence[str], dtypes: Sequence[DType], d: DType) -> str:
    """Integer ops through 64-bit helpers (or wrap-around unsigned arithmetic); the
    caller casts the result back to ``d``, which wraps like numpy."""
    signed = d.is_signed
    w = "i64" if signed else "u64"
    wide = "int64_t" if signed else "uint64_t"
    if fn in (ScalarFn.ADD, ScalarFn.SUB, ScalarFn.MUL):
        u = unsigned_wide(d)
        return f"({u})({a[0]}) {_INFIX[fn]} ({u})({a[1]})"
    if fn is ScalarFn.DIV:
        return f"tf_div_{w}({a[0]}, {a[1]})"
    if fn is ScalarFn.MOD:
        return f"tf_floormod({a[0]}, {a[1]})" if signed else f"tf_mod_u64({a[0]}, {a[1]})"
    if fn is ScalarFn.FMOD:
        return f"tf_fmod_i64({a[0]}, {a[1]})" if signed else f"tf_mod_u64({a[0]}, {a[1]})"
    if fn in (ScalarFn.MAX, ScalarFn.MIN):
        return f"tf_{fn.name.lower()}_{w}({a[0]}, {a[1]})"
    if fn is ScalarFn.NEG:
        return f"tf_neg_i64({a[0]})" if signed else f"0 - ({wide})({a[0]})"
    if fn is ScalarFn.ABS:
        return f"tf_abs_i64({a[0]})" if signed else a[0]
    if fn is ScalarFn.SIGN:
        return f"tf_sign_i64({a[0]})" if signed else f"({a[0]} != 0)"
    if fn is ScalarFn.NOT:
        return f"!({a[0]})"
    if fn is ScalarFn.BITNOT:
        return f"~({a[0]})"
    if fn in _BITWISE:
        return f"({a[0]}) {_BITWISE[fn]} ({a[1]})"
    bits = 8 * d.itemsize
    if fn is ScalarFn.SHL:
        return f"tf_shl_u64(({unsigned_wide(d)})({a[0]}), (uint64_t)({a[1]}), {bits})"
    if fn is ScalarFn.SHR:
        return f"tf_shr_{w}({a[0]}, (uint64_t)({a[1]}), {bits})"
    if fn is ScalarFn.POW:
        exp = a[1] if dtypes[1] is d else convert(a[1], dtypes[1], d)
        return f"tf_pow_i64({a[0]}, {exp})"
    raise UnsupportedScalar(f"{fn.name} on {d}")


def render_iop(op: IOp, a: str, b: str, a_nonneg: bool, b_pos_const: bool) -> str:
    """Index arithmetic in int64_t; floor semantics for // and %, plain C operators when
    the dividend is known non-negative and the divisor a positive constant."""
    if op is IOp.FLOORDIV:
        return f"({a} / {b})" if a_nonneg and b_pos_const else f"tf_floordiv({a}, {b})"
    if op is IOp.MOD:
        return f"({a} % {b})" if a_nonneg and b_pos_const else f"tf_floormod({a}, {b})"
    if op is IOp.MIN:
        return f"tf_min_i64({a}, {b})"
    if op is IOp.MAX:
        return f"tf_max_i64({a}, {b})"
    return f"({a} {op.value} {b})"
