"""Linear quantization and integer contractions -> Map, Gather, MatMul and Conv primitives.

Quantizing is ``saturate(round_half_even(x / scale) + zero_point)``: a DIV, a ROUND, an
ADD, a MAX/MIN pair and a CAST, all Maps the partitioner fuses into the producer's
epilogue. Dequantizing is ``(x - zero_point) * scale`` in float32. Scales and zero
points are laid out to broadcast against the data: a scalar (per tensor), a vector
reshaped onto ``axis`` (per axis), or, for blocked quantization, a Gather along
``axis`` that repeats each block's value ``block_size`` times.

Integer contractions (MatMulInteger, ConvInteger, the QLinear ops) cast their 8-bit
operands to int32, subtract the zero points there, and contract in int32, exactly as
the spec's accumulation rule says. Only the integer quantized types are supported
(int8, uint8, int16, uint16, and int32 where the spec allows it); float8, int4 and
int2 have no tilefuse dtype and the coverage scan reports them.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tilefuse.frontend.context import ONNX_DTYPES, NodeContext
from tilefuse.frontend.converters.nn import add_channel_bias, matmul_nd
from tilefuse.frontend.converters.shape_ops import normalize_axis
from tilefuse.frontend.converters.spatial import window
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Conv, Gather, ReduceFn
from tilefuse.ir.prims import ScalarFn as F

QUANTIZED = (DType.INT8, DType.UINT8, DType.INT16, DType.UINT16)


# -- helpers shared by every op of the family --------------------------------------------
def const_like(b: Builder, value: float, like: Value) -> Value:
    return b.scalar_like(value, like)


def saturate_cast(b: Builder, y: Value, to: DType) -> Value:
    """Clamp the (already integral) float ``y`` to ``to``'s range, then cast."""
    info = np.iinfo(to.numpy)
    y = b.map(F.MAX, y, const_like(b, info.min, y))
    y = b.map(F.MIN, y, const_like(b, info.max, y))
    return b.cast(y, to)


def requantize(b: Builder, y: Value, zero_point: Value | None, to: DType) -> Value:
    """``saturate(round_half_even(y) + zero_point)`` as ``to``; ``y`` is a float.

    The rounded value is widened to float32 before the zero point is added, so a
    uint16 zero point stays exact even when ``y`` is a half float.
    """
    rounded = b.map(F.ROUND, y)
    wide = b.cast(rounded, DType.FLOAT64 if y.type.dtype is DType.FLOAT64 else DType.FLOAT32)
    if zero_point is not None:
        wide = b.map(F.ADD, wide, b.cast(zero_point, wide.type.dtype))
    return saturate_cast(b, wide, to)


def to_int32(b: Builder, x: Value, zero_point: Value | None) -> Value:
    """``x - zero_point`` in int32, the accumulation type of integer contractions."""
    x32 = b.cast(x, DType.INT32)
    return x32 if zero_point is None else b.map(F.SUB, x32, b.cast(zero_point, DType.INT32))


def along_axis(
    ctx: NodeContext, param: Value, shape: Sequence[int], axis: int, block_size: int = 0
) -> Value:
    """A scale or zero point laid out to broadcast against data of ``shape``.

    One element: per tensor (a scalar). Otherwise per axis (a vector of
    ``shape[axis]`` values, reshaped onto ``axis``) or blocked (``block_size > 0``: the
    data's shape with ``ceil(shape[axis] / block_size)`` on ``axis``; a constant Gather
    repeats each value over its block).
    """
    b, rank = ctx.b, len(shape)
    if param.type.size == 1:
        return b.reshape(param, ())
    axis = normalize_axis(ctx, axis, rank)
    n = shape[axis]
    if block_size <= 0:
        if param.type.shape != (n,):
            raise ctx.error(f"a per-axis scale or zero point must be [{n}], got {param.type}")
        return b.reshape(param, [n if i == axis else 1 for i in range(rank)])
    blocks = list(shape)
    blocks[axis] = math.ceil(n / block_size)
    if list(param.type.shape) != blocks:
        raise ctx.error(f"blocked scale or zero point must be {blocks} for block_size={block_size}, got {param.type}")
    repeat = b.const(np.arange(n, dtype=np.int64) // block_size)
    return b.emit1(Gather(axis), param, repeat)


def _dtype_attr(ctx: NodeContext, name: str) -> DType | None:
    """An element-type attribute (0 or absent = unset) as a DType."""
    code = int(ctx.attr(name, 0) or 0)
    if code == 0:
        return None
    if code not in ONNX_DTYPES:
        raise ctx.unsupported(f"{name}={code} (element type without a tilefuse dtype)")
    return ONNX_DTYPES[code]


def _check_quantized(ctx: NodeContext, what: str, dtype: DType, allowed: Sequence[DType] = QUANTIZED) -> None:
    if dtype not in allowed:
        raise ctx.unsupported(f"{what} of type {dtype} (supported: {', '.join(map(str, allowed))})")


# -- QuantizeLinear / DequantizeLinear ----------------------------------------------------
def _division_dtype(x: Value, scale: Value, precision: DType | None) -> DType:
    """The dtype ``x / scale`` is computed in: ``precision`` when the node states it,
    else float32 (float64 if either operand is), as onnxruntime does also for half
    floats, so a half-float quotient is not rounded to half before it is rounded to
    an integer."""
    if precision is not None:
        return precision if precision.is_float else DType.FLOAT32
    wide = DType.FLOAT64 in (x.type.dtype, scale.type.dtype)
    return DType.FLOAT64 if wide else DType.FLOAT32


@converter("QuantizeLinear", since=10)
def quantize_linear(ctx: NodeContext) -> Value:
    """Per-tensor, per-axis or blocked quantization to (u)int8/(u)int16.

    The output type is ``output_dtype``, else the zero point's, else uint8.
    ``saturate`` only changes float8 outputs, which are not supported, so every
    supported output saturates.
    """
    b, x, scale, zero_point = ctx.b, ctx.input(0), ctx.input(1), ctx.optional_input(2)
    out = _dtype_attr(ctx, "output_dtype")
    if zero_point is not None:
        if out is not None and out is not zero_point.type.dtype:
            raise ctx.error(f"output_dtype {out} differs from y_zero_point's type {zero_point.type.dtype}")
        out = zero_point.type.dtype
    out = out or DType.UINT8
    _check_quantized(ctx, "output", out)
    axis, block_size = ctx.attr("axis", 1), int(ctx.attr("block_size", 0) or 0)
    shape = x.type.shape
    p = _division_dtype(x, scale, _dtype_attr(ctx, "precision"))
    scale = b.cast(along_axis(ctx, scale, shape, axis, block_size), p)
    if zero_point is not None:
        zero_point = along_axis(ctx, zero_point, shape, axis, block_size)
    return requantize(b, b.map(F.DIV, b.cast(x, p), scale), zero_point, out)


@converter("DequantizeLinear", since=10)
def dequantize_linear(ctx: NodeContext) -> Value:
    """``(x - x_zero_point) * x_scale`` computed in float32, returned as ``output_dtype``
    (default: the scale's type); per tensor, per axis or blocked."""
    b, x, scale, zero_point = ctx.b, ctx.input(0), ctx.input(1), ctx.optional_input(2)
    _check_quantized(ctx, "input", x.type.dtype, QUANTIZED + (DType.INT32,))
    out = _dtype_attr(ctx, "output_dtype") or scale.type.dtype
    if not out.is_float:
        raise ctx.error(f"output_dtype must be a float type, got {out}")
    axis, block_size = ctx.attr("axis", 1), int(ctx.attr("block_size", 0) or 0)
    shape = x.type.shape
    wide = DType.FLOAT64 if out is DType.FLOAT64 else DType.FLOAT32
    y = b.cast(x, wide)
    if zero_point is not None:
        if zero_point.type.dtype is not x.type.dtype:
            raise ctx.error(f"x_zero_point's type {zero_point.type.dtype} differs from x's {x.type.dtype}")
        y = b.map(F.SUB, y, b.cast(along_axis(ctx, zero_point, shape, axis, block_size), wide))
    y = b.map(F.MUL, y, b.cast(along_axis(ctx, scale, shape, axis, block_size), wide))
    return b.cast(y, out)


@converter("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx: NodeContext) -> list[Value]:
    """uint8 quantization with a scale and zero point computed from the data's range
    (widened to include 0). An all-zero input gets scale 1, as onnxruntime gives it
    (the spec's formula would divide by zero)."""
    b, x = ctx.b, ctx.input(0)
    if x.type.dtype is not DType.FLOAT32:
        raise ctx.error(f"x must be float32, got {x.type.dtype}")
    axes = tuple(range(x.type.rank))
    zero = const_like(b, 0, x)
    hi = b.map(F.MAX, b.reduce(ReduceFn.MAX, x, axes, keepdims=False), zero)
    lo = b.map(F.MIN, b.reduce(ReduceFn.MIN, x, axes, keepdims=False), zero)
    spread = b.map(F.SUB, hi, lo)
    spread = b.map(F.WHERE, b.map(F.EQ, spread, zero), const_like(b, 255, x), spread)
    scale = b.map(F.DIV, spread, const_like(b, 255, x))
    zp_float = b.map(F.SUB, zero, b.map(F.DIV, lo, scale))
    zp_float = b.map(F.MIN, b.map(F.MAX, zp_float, zero), const_like(b, 255, x))
    zero_point = b.cast(b.map(F.ROUND, zp_float), DType.UINT8)
    y = requantize(b, b.map(F.DIV, x, scale), zero_point, DType.UINT8)
    return [y, scale, zero_point]


# -- integer contractions -----------------------------------------------------------------
def row_param(b: Builder, param: Value | None, a: Value) -> Value | None:
    """A per-row parameter of the left matmul operand ``a [..., M, K]``: a vector of M
    values applies to the rows, so it becomes ``[M, 1]``; other shapes broadcast as given."""
    if param is None or param.type.rank != 1 or param.type.size == 1 or a.type.rank < 2:
        return param
    return b.reshape(param, (param.type.size, 1))


def channel_param(b: Builder, param: Value | None, rank: int) -> Value | None:
    """A per-output-channel parameter of a convolution: ``[M]`` becomes ``[M, 1, ...]``
    against a ``rank``-d tensor whose channel axis is 0 (weights) or 1 (outputs, pass
    ``rank - 1``)."""
    if param is None:
        return None
    if param.type.size == 1:
        return as_scalar(b, param)
    return b.reshape(param, (param.type.size,) + (1,) * (rank - 1))


def as_scalar(b: Builder, param: Value) -> Value:
    """A one-element (per tensor) parameter as a 0-d value."""
    return b.reshape(param, ())


@converter("MatMulInteger", since=10)
def matmul_integer(ctx: NodeContext) -> Value:
    """``(A - a_zero_point) @ (B - b_zero_point)`` in int32; per-row / per-column zero points."""
    b, a, c = ctx.b, ctx.input(0), ctx.input(1)
    for what, v in (("A", a), ("B", c)):
        _check_quantized(ctx, what, v.type.dtype, (DType.INT8, DType.UINT8))
    a_zero, c_zero = ctx.optional_input(2), ctx.optional_input(3)
    if (c.data is not None and c.type.rank == 2 and (a_zero is None or a_zero.type.size == 1)
            and (c_zero is None or (c_zero.data is not None and not c_zero.data.any()))):
        return _by_constant(b, a, a_zero, c)
    return matmul_nd(b, to_int32(b, a, row_param(b, a_zero, a)), to_int32(b, c, c_zero))


def _by_constant(b: Builder, a: Value, a_zero: Value | None, c: Value) -> Value:
    """``(A - z) @ C`` for a constant 8-bit matrix ``C`` (zero points zero) and one zero
    point ``z`` as ``A @ C - z * colsum(C)``: both operands are the 8-bit values cast to
    int32 (a host's integer product core reads them as they are: ``lower/panels.py``),
    and the zero point costs one constant vector."""
    assert c.data is not None
    acc = matmul_nd(b, b.cast(a, DType.INT32), b.cast(c, DType.INT32))
    if a_zero is None:
        return acc
    sums = c.data.astype(np.int64).sum(axis=0)
    shift = b.map(F.MUL, b.cast(as_scalar(b, a_zero), DType.INT32), b.const(sums.astype(np.int32)))
    return b.map(F.SUB, acc, shift)


def _conv_int32(ctx: NodeContext, x: Value, w: Value, x_zero: Value | None, w_zero: Value | None) -> Value:
    """The int32 convolution of ``x - x_zero`` with ``w - w_zero`` (zero points per
    tensor, or per output channel for ``w``); padding adds zeros after the shift, so
    it is the zero point in the quantized domain, as the spec requires."""
    b = ctx.b
    for what, v in (("x", x), ("w", w)):
        _check_quantized(ctx, what, v.type.dtype, (DType.INT8, DType.UINT8))
    if x.type.rank < 3 or w.type.rank != x.type.rank:
        raise ctx.error(f"x and w must have the same rank >= 3, got {x.type} and {w.type}")
    kernel = ctx.attr("kernel_shape")
    if kernel and tuple(kernel) != w.type.shape[2:]:
        raise ctx.error(f"kernel_shape {list(kernel)} does not match w {w.type}")
    x32 = to_int32(b, x, None if x_zero is None else as_scalar(b, x_zero))
    w32 = to_int32(b, w, channel_param(b, w_zero, w.type.rank))
    geo = window(ctx, x.type.shape[2:], w.type.shape[2:])
    return b.emit1(Conv(geo.strides, geo.dilations, geo.pads, ctx.attr("group", 1)), x32, w32)


@converter("ConvInteger", since=10)
def conv_integer(ctx: NodeContext) -> Value:
    """Integer convolution with int32 output; every Conv attribute."""
    return _conv_int32(ctx, ctx.input(0), ctx.input(1), ctx.optional_input(2), ctx.optional_input(3))


def _output_scale(b: Builder, product: Value, y_scale: Value) -> Value:
    """``product / y_scale`` in float32: the factor that takes the int32 accumulator to
    the output's quantized units. Half-float scales are widened first, as onnxruntime
    does, so the factor is not rounded to half."""
    return b.map(F.DIV, product, b.cast(y_scale, DType.FLOAT32))


def _check_scales(ctx: NodeContext, *scales: Value) -> None:
    for s in scales:
        if not s.type.dtype.is_float:
            raise ctx.error(f"scales must be floats, got {s.type.dtype}")


@converter("QLinearMatMul", since=10)
def qlinear_matmul(ctx: NodeContext) -> Value:
    """Quantized matmul: int32 product of the shifted operands, rescaled by
    ``a_scale * b_scale / y_scale`` in float32, then requantized to y's type."""
    b = ctx.b
    a, a_scale, a_zero = ctx.input(0), ctx.input(1), ctx.input(2)
    c, c_scale, c_zero = ctx.input(3), ctx.input(4), ctx.input(5)
    y_scale, y_zero = ctx.input(6), ctx.input(7)
    for what, v in (("a", a), ("b", c), ("y_zero_point", y_zero)):
        _check_quantized(ctx, what, v.type.dtype, (DType.INT8, DType.UINT8))
    _check_scales(ctx, a_scale, c_scale, y_scale)
    acc = matmul_nd(b, to_int32(b, a, row_param(b, a_zero, a)), to_int32(b, c, c_zero))
    row_scale = row_param(b, a_scale, a)
    assert row_scale is not None
    product = b.map(F.MUL, b.cast(row_scale, DType.FLOAT32), b.cast(c_scale, DType.FLOAT32))
    y = b.map(F.MUL, b.cast(acc, DType.FLOAT32), _output_scale(b, product, y_scale))
    return requantize(b, y, y_zero, y_zero.type.dtype)


@converter("QLinearConv", since=10)
def qlinear_conv(ctx: NodeContext) -> Value:
    """Quantized convolution: int32 convolution (plus the int32 bias), rescaled by
    ``x_scale * w_scale / y_scale`` (``w_scale`` per tensor or per output channel),
    then requantized to y's type."""
    b = ctx.b
    x, x_scale, x_zero = ctx.input(0), ctx.input(1), ctx.input(2)
    w, w_scale, w_zero = ctx.input(3), ctx.input(4), ctx.input(5)
    y_scale, y_zero = ctx.input(6), ctx.input(7)
    _check_quantized(ctx, "y_zero_point", y_zero.type.dtype, (DType.INT8, DType.UINT8))
    _check_scales(ctx, x_scale, w_scale, y_scale)
    acc = add_channel_bias(b, _conv_int32(ctx, x, w, x_zero, w_zero), ctx.optional_input(8))
    channel_scale = channel_param(b, w_scale, acc.type.rank - 1)
    assert channel_scale is not None
    product = b.map(F.MUL, b.cast(as_scalar(b, x_scale), DType.FLOAT32), b.cast(channel_scale, DType.FLOAT32))
    y = b.map(F.MUL, b.cast(acc, DType.FLOAT32), _output_scale(b, product, y_scale))
    return requantize(b, y, as_scalar(b, y_zero), y_zero.type.dtype)
