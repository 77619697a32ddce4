"""Tile-IR expressions as TileLang text: the base of the CUDA printer (emit.py, warp_rows.py).

A kernel module names every buffer and variable once (a Python identifier, made unique),
defines each typed scalar constant once at module level (``_c0 = T.float32(1.0)``), and
binds a subexpression a statement uses twice to a ``let`` name, except under a WHERE
branch, whose loads may be out of range when the branch is not taken. Index arithmetic is
int32 text (tensors stay below 2^31 elements). A load the printer reads from a register
instead of its buffer (a running value, a warp's row value) is in ``replaced``.
"""
from __future__ import annotations

import keyword
import math
import re
from collections import Counter

from tilefuse.codegen.cuda.fast_math import DeviceCall, fast_forms
from tilefuse.codegen.options import CudaOptions
from tilefuse.errors import CompileError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Buffer, Call, Const, Expr, IndexCheck, IndexOp, IOp, Load, STATUS, TileProgram, Var, dtype_of
from tilefuse.tile_ir.passes.placement import HALF


def shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def dtype_text(dtype: DType) -> str:
    return f'"{dtype.value}"'


_INFIX_IOP = {IOp.ADD: "+", IOp.SUB: "-", IOp.MUL: "*", IOp.FLOORDIV: "//", IOp.MOD: "%",
              IOp.LT: "<", IOp.LE: "<=", IOp.GE: ">=", IOp.EQ: "=="}
_UNARY = {
    ScalarFn.ABS: "T.abs", ScalarFn.SQRT: "T.sqrt", ScalarFn.EXP: "T.exp", ScalarFn.LOG: "T.log",
    ScalarFn.FLOOR: "T.floor", ScalarFn.CEIL: "T.ceil", ScalarFn.ROUND: "T.nearbyint", ScalarFn.ERF: "T.erf",
    ScalarFn.TANH: "T.tanh", ScalarFn.SIGMOID: "T.sigmoid", ScalarFn.SIN: "T.sin", ScalarFn.COS: "T.cos",
    ScalarFn.TAN: "T.tan", ScalarFn.ASIN: "T.asin", ScalarFn.ACOS: "T.acos", ScalarFn.ATAN: "T.atan",
    ScalarFn.SINH: "T.sinh", ScalarFn.COSH: "T.cosh", ScalarFn.ASINH: "T.asinh", ScalarFn.ACOSH: "T.acosh",
    ScalarFn.ATANH: "T.atanh", ScalarFn.ISNAN: "T.isnan", ScalarFn.ISINF: "T.isinf",
    ScalarFn.BITNOT: "T.bitwise_not", ScalarFn.NOT: "T.Not",
}
_INFIX = {ScalarFn.ADD: "+", ScalarFn.SUB: "-", ScalarFn.MUL: "*", ScalarFn.EQ: "==", ScalarFn.LT: "<",
          ScalarFn.LE: "<=", ScalarFn.GT: ">", ScalarFn.GE: ">="}
_BINARY = {ScalarFn.MAX: "T.max", ScalarFn.MIN: "T.min", ScalarFn.POW: "T.pow", ScalarFn.BITAND: "T.bitwise_and",
           ScalarFn.BITOR: "T.bitwise_or", ScalarFn.BITXOR: "T.bitwise_xor", ScalarFn.SHL: "T.shift_left",
           ScalarFn.SHR: "T.shift_right", ScalarFn.AND: "T.And", ScalarFn.OR: "T.Or"}


class ExprPrinter:
    """Names, constants and expression text of one kernel module."""

    def __init__(self, program: TileProgram, options: CudaOptions) -> None:
        self.p, self.options = program, options
        self.header: list[str] = []  # module-level constants
        self._consts: dict[tuple[str, str], str] = {}
        self._names: dict[str, str] = {}
        self._taken = {"T"}
        self._temps = 0
        self.replaced: dict[tuple[str, tuple[Expr, ...]], str] = {}  # a Load read from a register

    # -- names -------------------------------------------------------------------------
    def name(self, b: Buffer | Var) -> str:
        key = b.name
        if key not in self._names:
            text = re.sub(r"[^A-Za-z0-9_]", "_", key) or "_"
            if text[0].isdigit() or keyword.iskeyword(text) or text.startswith("_"):
                text = "v_" + text.lstrip("_")
            while text in self._taken:
                text += "_"
            self._taken.add(text)
            self._names[key] = text
        return self._names[key]

    def temp(self) -> str:
        self._temps += 1
        return f"_t{self._temps}"

    def const(self, value: float | int | bool, dtype: DType) -> str:
        """A typed scalar constant, defined once at module level."""
        if dtype is DType.BOOL:
            text = f"T.bool({bool(value)})"
        elif dtype.is_float:
            v = float(value)
            text = f"T.{dtype.value}({v!r})" if math.isfinite(v) else f'T.{dtype.value}(float("{v}"))'
        else:
            text = f"T.{dtype.value}({int(value)})"
        key = (text, dtype.value)
        if key not in self._consts:
            self._consts[key] = f"_c{len(self._consts)}"
            self.header.append(f"{self._consts[key]} = {text}")
        return self._consts[key]

    # -- expressions -------------------------------------------------------------------
    def index(self, e: Expr) -> str:
        lets, (text,) = self.render([e], [True])
        if lets:
            raise CompileError(f"kernel {self.p.name}: region offset too complex for TileLang: {text}")
        return text

    def render(self, roots: list[Expr], is_index: list[bool]) -> tuple[list[str], list[str]]:
        """Text of each root, with ``let`` lines for subexpressions used more than once
        (outside WHERE branches)."""
        if self.options.fast_erf_sum:  # values only: index arithmetic holds no erf
            roots = [r if index else fast_forms(r) for r, index in zip(roots, is_index)]
        counts: Counter = Counter()
        seen: set[int] = set()

        def count(e: Expr, guarded: bool) -> None:
            if isinstance(e, (Var, Const)) or guarded:
                return
            counts[e] += 1
            if id(e) in seen:
                return
            seen.add(id(e))
            if isinstance(e, IndexOp):
                count(e.a, False)
                count(e.b, False)
            elif isinstance(e, Load):
                for x in e.indices:
                    count(x, False)
            elif isinstance(e, Call):
                for k, x in enumerate(e.args):
                    count(x, e.fn is ScalarFn.WHERE and k > 0)
            elif isinstance(e, DeviceCall):
                for x in e.args:
                    count(x, False)
            elif isinstance(e, IndexCheck):
                count(e.index, False)

        for r in roots:
            count(r, False)
        lets: list[str] = []
        bound: dict[Expr, str] = {}
        memo: dict[int, str] = {}

        def text(e: Expr, guarded: bool) -> str:
            if not guarded and e in bound:
                return bound[e]
            key = id(e)
            if not guarded and key in memo:
                return memo[key]
            t = self._expr(e, lambda x, g=False: text(x, guarded or g))
            if not guarded and counts[e] > 1 and not isinstance(e, (Var, Const)):
                name = self.temp()
                lets.append(f"{name} = {t}")
                bound[e] = name
                t = name
            if not guarded:
                memo[key] = t
            return t

        return lets, [text(r, False) for r in roots]

    def _expr(self, e: Expr, sub) -> str:
        if isinstance(e, Var):
            return self.name(e)
        if isinstance(e, Const):
            if e.dtype is DType.INT64 and isinstance(e.value, int) and not isinstance(e.value, bool):
                return str(int(e.value))  # index arithmetic: int32
            return self.const(e.value, e.dtype)
        if isinstance(e, IndexOp):
            a, b = sub(e.a), sub(e.b)
            if e.op in _INFIX_IOP:
                return f"({a} {_INFIX_IOP[e.op]} {b})"
            return {IOp.MIN: f"T.min({a}, {b})", IOp.MAX: f"T.max({a}, {b})",
                    IOp.AND: f"T.And({a}, {b})", IOp.OR: f"T.Or({a}, {b})"}[e.op]
        if isinstance(e, Load):
            local = self.replaced.get((e.buffer.name, e.indices))
            if local is not None:
                return local
            return f"{self.name(e.buffer)}[{', '.join(sub(i) for i in e.indices)}]"
        if isinstance(e, Call):
            return self._call(e, sub)
        if isinstance(e, DeviceCall):
            return f'T.call_extern("float32", "{e.name}", {", ".join(sub(a) for a in e.args)})'
        if isinstance(e, IndexCheck):  # tilefuse_math.cuh: wraps, or records in the status word and reads 0
            status = self.name(STATUS)
            return f'T.call_extern("int32", "tf_index", {sub(e.index)}, {e.extent}, T.address_of({status}[0]), {e.site})'
        raise CompileError(f"kernel {self.p.name}: unknown expression {e!r}")

    def _call(self, e: Call, sub) -> str:
        fn, dt = e.fn, e.dtype
        if fn is ScalarFn.WHERE:
            c = sub(e.args[0])
            return f"T.if_then_else({c}, {sub(e.args[1], True)}, {sub(e.args[2], True)})"
        args = [sub(a) for a in e.args]
        src = dtype_of(e.args[0])
        is_float = dt.is_float
        if fn is ScalarFn.CAST:
            if dt is DType.BOOL:
                return f"({args[0]} != {self.const(0, src)})" if src is not DType.BOOL else args[0]
            if dt in HALF and not src.is_float:  # CUTLASS's half has no single int64 -> half conversion
                return f'T.Cast("{dt.value}", T.Cast("float32", {args[0]}))'
            return f'T.Cast("{dt.value}", {args[0]})'
        if fn in _UNARY:
            return f"{_UNARY[fn]}({args[0]})"
        if fn is ScalarFn.NEG:
            return f"(-{args[0]})"
        if fn is ScalarFn.RECIPROCAL:
            return f"({self.const(1, dt)} / {args[0]})"
        if fn is ScalarFn.SIGN:
            one, zero = self.const(1, dt), self.const(0, dt)
            return f"T.if_then_else({args[0]} > {zero}, {one}, T.if_then_else({args[0]} < {zero}, -{one}, {zero}))"
        if fn in _INFIX:
            return f"({args[0]} {_INFIX[fn]} {args[1]})"
        if fn in _BINARY:
            return f"{_BINARY[fn]}({args[0]}, {args[1]})"
        if fn is ScalarFn.XOR:
            return f"({args[0]} != {args[1]})"
        if fn is ScalarFn.DIV:
            return f"({args[0]} / {args[1]})" if is_float else f"T.truncdiv({args[0]}, {args[1]})"
        if fn is ScalarFn.MOD:  # sign of the divisor
            if is_float:
                return f"({args[0]} - T.floor({args[0]} / {args[1]}) * {args[1]})"
            return f"T.floormod({args[0]}, {args[1]})"
        if fn is ScalarFn.FMOD:  # sign of the dividend
            return f"T.fmod({args[0]}, {args[1]})" if is_float else f"T.truncmod({args[0]}, {args[1]})"
        raise CompileError(f"kernel {self.p.name}: no TileLang form for {fn.name}")
