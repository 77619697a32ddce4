"""Elementwise ONNX ops -> chains of Map primitives.

Parameters (alpha, beta, bounds) become constant inputs, so every activation is a
short expression over the same scalar functions the partitioner fuses freely.
"""
from __future__ import annotations

import functools
import math
from functools import reduce as _fold
from typing import Callable

from tilefuse.frontend.context import NodeContext, onnx_dtype
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import HALF_FLOATS, DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import ScalarFn as F

_UNARY = {
    "Neg": F.NEG, "Abs": F.ABS, "Sign": F.SIGN, "Reciprocal": F.RECIPROCAL, "Sqrt": F.SQRT,
    "Exp": F.EXP, "Log": F.LOG, "Floor": F.FLOOR, "Ceil": F.CEIL, "Round": F.ROUND,
    "Erf": F.ERF, "Tanh": F.TANH, "Sigmoid": F.SIGMOID, "Sin": F.SIN, "Cos": F.COS,
    "Tan": F.TAN, "Asin": F.ASIN, "Acos": F.ACOS, "Atan": F.ATAN, "Sinh": F.SINH,
    "Cosh": F.COSH, "Asinh": F.ASINH, "Acosh": F.ACOSH, "Atanh": F.ATANH,
    "IsNaN": F.ISNAN, "Not": F.NOT, "BitwiseNot": F.BITNOT,
}
_BINARY = {
    "Add": F.ADD, "Sub": F.SUB, "Mul": F.MUL, "Div": F.DIV,
    "Equal": F.EQ, "Less": F.LT, "LessOrEqual": F.LE, "Greater": F.GT, "GreaterOrEqual": F.GE,
    "And": F.AND, "Or": F.OR, "Xor": F.XOR,
    "BitwiseAnd": F.BITAND, "BitwiseOr": F.BITOR, "BitwiseXor": F.BITXOR,
}
_SINCE = {"BitwiseNot": 18, "BitwiseAnd": 18, "BitwiseOr": 18, "BitwiseXor": 18}


def _register_unary(op: str, fn: F) -> None:
    @converter(op, since=_SINCE.get(op, 1))
    def convert(ctx: NodeContext) -> Value:
        return ctx.b.map(fn, ctx.input(0))


def _register_binary(op: str, fn: F) -> None:
    @converter(op, since=_SINCE.get(op, 1))
    def convert(ctx: NodeContext) -> Value:
        return ctx.b.map(fn, ctx.input(0), ctx.input(1))


for _op, _fn in _UNARY.items():
    _register_unary(_op, _fn)
for _op, _fn in _BINARY.items():
    _register_binary(_op, _fn)


def half_in_float32(convert: Callable[[NodeContext], Value]) -> Callable[[NodeContext], Value]:
    """Composite activations of float16/bfloat16 inputs compute in float32 and round
    once at the end, as onnxruntime does (and as a fused kernel would, in registers)."""

    @functools.wraps(convert)
    def wrapped(ctx: NodeContext) -> Value:
        x = ctx.input(0)
        if x.type.dtype not in HALF_FLOATS:
            return convert(ctx)
        ctx.inputs = [ctx.b.cast(x, DType.FLOAT32), *ctx.inputs[1:]]
        return ctx.b.cast(convert(ctx), x.type.dtype)

    return wrapped


def scalar(b: Builder, value: float, like: Value) -> Value:
    return b.scalar_like(value, like)


def mul_scalar(b: Builder, x: Value, value: float) -> Value:
    return x if value == 1 else b.map(F.MUL, x, scalar(b, value, x))


@converter("Pow")
def pow_(ctx: NodeContext) -> Value:
    """Pow by a constant scalar exponent becomes the cheaper, canonical form
    (x*x, sqrt, reciprocal), so a spelled-out LayerNorm and a LayerNormalization
    node give the same primitives."""
    b, x, e = ctx.b, ctx.input(0), ctx.input(1)
    if e.data is not None and e.type.size == 1 and x.type.dtype.is_float:
        k = float(e.data.reshape(()))
        shape = _broadcast_shape(x, e)
        if k == 1:
            return b.broadcast(x, shape)
        if k == 2:
            return b.broadcast(b.map(F.MUL, x, x), shape)
        if k == 3:  # GELU's tanh form: x * x * x, not powf
            return b.broadcast(b.map(F.MUL, b.map(F.MUL, x, x), x), shape)
        if k == 0.5:
            return b.broadcast(b.map(F.SQRT, x), shape)
        if k == -1:
            return b.broadcast(b.map(F.RECIPROCAL, x), shape)
    return b.map(F.POW, x, e)


def _broadcast_shape(x: Value, e: Value) -> tuple[int, ...]:
    from tilefuse.ir.types import broadcast_shapes

    return broadcast_shapes(x.type.shape, e.type.shape)


@converter("IsInf")
def is_inf(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    inf = b.map(F.ISINF, x)
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if pos and neg:
        return inf
    if not pos and not neg:
        return b.map(F.AND, inf, b.const(False))
    side = b.map(F.GT if pos else F.LT, x, scalar(b, 0, x))
    return b.map(F.AND, inf, side)


@converter("Mod")
def mod(ctx: NodeContext) -> Value:
    # fmod=0: the result takes the divisor's sign (Python's %), also for floats.
    fmod = ctx.attr("fmod", 0)
    return ctx.b.map(F.FMOD if fmod else F.MOD, ctx.input(0), ctx.input(1))


@converter("BitShift")
def bit_shift(ctx: NodeContext) -> Value:
    fn = F.SHL if ctx.attr("direction") == "LEFT" else F.SHR
    return ctx.b.map(fn, ctx.input(0), ctx.input(1))


def _variadic(fn: F):
    def convert(ctx: NodeContext) -> Value:
        xs = [v for v in ctx.inputs if v is not None]
        return _fold(lambda a, c: ctx.b.map(fn, a, c), xs)

    return convert


converter("Max")(_variadic(F.MAX))
converter("Min")(_variadic(F.MIN))
converter("Sum")(_variadic(F.ADD))


@converter("Mean")
def mean(ctx: NodeContext) -> Value:
    xs = [v for v in ctx.inputs if v is not None]
    total = _variadic(F.ADD)(ctx)
    return ctx.b.map(F.DIV, total, scalar(ctx.b, len(xs), xs[0]))


@converter("Where")
def where(ctx: NodeContext) -> Value:
    return ctx.b.map(F.WHERE, ctx.input(0), ctx.input(1), ctx.input(2))


@converter("Cast")
def cast(ctx: NodeContext) -> Value:
    if ctx.attr("saturate", 1) == 0:
        pass  # only affects float8 targets, which are not supported anyway
    return ctx.b.cast(ctx.input(0), onnx_dtype(ctx.attr("to"), f"Cast node {ctx.label!r}"))


@converter("CastLike")
def cast_like(ctx: NodeContext) -> Value:
    return ctx.b.cast(ctx.input(0), ctx.input(1).type.dtype)


@converter("Identity")
def identity(ctx: NodeContext) -> Value:
    return ctx.input(0)


@converter("Dropout")
def dropout(ctx: NodeContext) -> list[Value]:
    # Inference: the output is the input and the mask all true. In training mode that
    # holds only for ratio 0; any other ratio is random and not supported.
    b, x = ctx.b, ctx.input(0)
    training = ctx.optional_const_input(2)
    ratio = ctx.optional_const_input(1)
    if training is not None and bool(training.reshape(())):
        if ratio is None or float(ratio.reshape(())) != 0.0:
            raise ctx.unsupported("training_mode=true with ratio > 0 (random dropout)")
    mask = b.broadcast(b.const(True), x.type.shape)
    return [x, mask]


@converter("Clip", since=11)
def clip(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    lo, hi = ctx.optional_input(1), ctx.optional_input(2)
    if lo is not None:
        x = b.map(F.MAX, x, lo)
    if hi is not None:
        x = b.map(F.MIN, x, hi)
    return x


@converter("Relu")
def relu(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    return ctx.b.map(F.MAX, x, scalar(ctx.b, 0, x))


@converter("LeakyRelu")
def leaky_relu(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    neg = b.map(F.LT, x, scalar(b, 0, x))
    return b.map(F.WHERE, neg, mul_scalar(b, x, ctx.attr("alpha", 0.01)), x)


@converter("PRelu")
def prelu(ctx: NodeContext) -> Value:
    b, x, slope = ctx.b, ctx.input(0), ctx.input(1)
    neg = b.map(F.LT, x, scalar(b, 0, x))
    return b.map(F.WHERE, neg, b.map(F.MUL, x, slope), x)


def elu_of(b: Builder, x: Value, alpha: float) -> Value:
    neg = b.map(F.LT, x, scalar(b, 0, x))
    expm1 = b.map(F.SUB, b.map(F.EXP, x), scalar(b, 1, x))
    return b.map(F.WHERE, neg, mul_scalar(b, expm1, alpha), x)


@converter("Elu")
@half_in_float32
def elu(ctx: NodeContext) -> Value:
    return elu_of(ctx.b, ctx.input(0), ctx.attr("alpha", 1.0))


@converter("Celu")
@half_in_float32
def celu(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    alpha = ctx.attr("alpha", 1.0)
    return mul_scalar(b, elu_of(b, mul_scalar(b, x, 1.0 / alpha), 1.0), alpha)


@converter("Selu")
@half_in_float32
def selu(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    alpha, gamma = ctx.attr("alpha", 1.67326319217681884765625), ctx.attr("gamma", 1.05070102214813232421875)
    return mul_scalar(b, elu_of(b, x, alpha), gamma)


@converter("ThresholdedRelu")
def thresholded_relu(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    keep = b.map(F.GT, x, scalar(b, ctx.attr("alpha", 1.0), x))
    return b.map(F.WHERE, keep, x, scalar(b, 0, x))


def hard_sigmoid_of(b: Builder, x: Value, alpha: float, beta: float) -> Value:
    y = b.map(F.ADD, mul_scalar(b, x, alpha), scalar(b, beta, x))
    return b.map(F.MIN, b.map(F.MAX, y, scalar(b, 0, x)), scalar(b, 1, x))


@converter("HardSigmoid")
@half_in_float32
def hard_sigmoid(ctx: NodeContext) -> Value:
    return hard_sigmoid_of(ctx.b, ctx.input(0), ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5))


@converter("HardSwish", since=14)
@half_in_float32
def hard_swish(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    return b.map(F.MUL, x, hard_sigmoid_of(b, x, 1.0 / 6.0, 0.5))


def softplus_of(b: Builder, x: Value) -> Value:
    # log(1 + exp(x)) = max(x, 0) + log(1 + exp(-|x|)): no overflow for large |x|.
    tail = b.map(F.LOG, b.map(F.ADD, scalar(b, 1, x), b.map(F.EXP, b.map(F.NEG, b.map(F.ABS, x)))))
    return b.map(F.ADD, b.map(F.MAX, x, scalar(b, 0, x)), tail)


@converter("Softplus")
@half_in_float32
def softplus(ctx: NodeContext) -> Value:
    return softplus_of(ctx.b, ctx.input(0))


@converter("Softsign")
@half_in_float32
def softsign(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    return b.map(F.DIV, x, b.map(F.ADD, scalar(b, 1, x), b.map(F.ABS, x)))


@converter("Mish", since=18)
@half_in_float32
def mish(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    return b.map(F.MUL, x, b.map(F.TANH, softplus_of(b, x)))


def gelu_of(b: Builder, x: Value, approximate: str) -> Value:
    half = b.map(F.MUL, x, scalar(b, 0.5, x))
    if approximate == "tanh":
        cube = b.map(F.MUL, b.map(F.MUL, x, x), x)
        inner = b.map(F.ADD, x, mul_scalar(b, cube, 0.044715))
        t = b.map(F.TANH, mul_scalar(b, inner, math.sqrt(2.0 / math.pi)))
    else:
        t = b.map(F.ERF, mul_scalar(b, x, 1.0 / math.sqrt(2.0)))
    return b.map(F.MUL, half, b.map(F.ADD, t, scalar(b, 1, x)))


@converter("Gelu", since=20)
@half_in_float32
def gelu(ctx: NodeContext) -> Value:
    x = ctx.input(0)
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.unsupported(f"approximate={approximate!r}")
    return gelu_of(ctx.b, x, approximate)


@converter("Shrink")
def shrink(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    bias, lambd = ctx.attr("bias", 0.0), ctx.attr("lambd", 0.5)
    low = b.map(F.LT, x, scalar(b, -lambd, x))
    high = b.map(F.GT, x, scalar(b, lambd, x))
    zero = scalar(b, 0, x)
    y = b.map(F.WHERE, high, b.map(F.SUB, x, scalar(b, bias, x)), zero)
    return b.map(F.WHERE, low, b.map(F.ADD, x, scalar(b, bias, x)), y)


@converter("Swish", since=24)
@half_in_float32
def swish(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    return b.map(F.MUL, x, b.map(F.SIGMOID, mul_scalar(b, x, ctx.attr("alpha", 1.0))))
