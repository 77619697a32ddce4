"""Contractions -> MatMul / Conv / ConvTranspose primitives, with Maps around them.

Bias, ``alpha`` and ``beta`` are separate Maps, never part of the contraction: the
partitioner fuses them back as the contraction's epilogue. The other neural-network
families live in their own modules, imported at the end of this one so that importing
``nn`` registers them all: pooling, norms, attention, einsum.
"""
from __future__ import annotations

import math

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import scalar
from tilefuse.frontend.converters.spatial import span, split_total, window
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Conv, ConvTranspose, Pad
from tilefuse.ir.prims import ScalarFn as F


def matmul_nd(b: Builder, a: Value, c: Value) -> Value:
    """numpy ``matmul``: a 1-D operand becomes a matrix for the product (a row on the
    left, a column on the right) and its added dim is dropped from the result."""
    a2 = b.reshape(a, (1,) + a.type.shape) if a.type.rank == 1 else a
    c2 = b.reshape(c, c.type.shape + (1,)) if c.type.rank == 1 else c
    y = b.matmul(a2, c2)
    shape = y.type.shape
    if c.type.rank == 1:
        shape = shape[:-1]
    if a.type.rank == 1:
        shape = shape[:-2] + shape[-1:] if c.type.rank > 1 else shape[:-1]
    return b.reshape(y, shape)


@converter("MatMul")
def matmul(ctx: NodeContext) -> Value:
    a, c = ctx.input(0), ctx.input(1)
    if a.type.rank == 0 or c.type.rank == 0:
        raise ctx.error("MatMul operands must have rank >= 1")
    return matmul_nd(ctx.b, a, c)


def mul_by(b: Builder, x: Value, factor: float) -> Value:
    return x if factor == 1 else b.map(F.MUL, x, scalar(b, factor, x))


@converter("Gemm")
def gemm(ctx: NodeContext) -> Value:
    """``alpha * A' B' + beta * C`` with A' and B' optionally transposed; C broadcasts."""
    b = ctx.b
    a, c = ctx.input(0), ctx.input(1)
    if a.type.rank != 2 or c.type.rank != 2:
        raise ctx.error(f"A and B must be matrices, got {a.type} and {c.type}")
    if ctx.attr("transA", 0):
        a = b.transpose(a, (1, 0))
    if ctx.attr("transB", 0):
        c = b.transpose(c, (1, 0))
    y = mul_by(b, b.matmul(a, c), ctx.attr("alpha", 1.0))
    bias = ctx.optional_input(2)
    beta = ctx.attr("beta", 1.0)
    if bias is not None and beta != 0:
        y = b.map(F.ADD, y, mul_by(b, bias, beta))
    return y


def add_channel_bias(b: Builder, y: Value, bias: Value | None) -> Value:
    """``y [N, M, *S] + bias [M]``, the bias viewed as ``[M, 1, ...]``."""
    if bias is None:
        return y
    return b.map(F.ADD, y, b.reshape(bias, (bias.type.size,) + (1,) * (y.type.rank - 2)))


def _check_conv_operands(ctx: NodeContext, x: Value, w: Value) -> None:
    if x.type.rank < 3 or w.type.rank != x.type.rank:
        raise ctx.error(f"X and W must have the same rank >= 3, got {x.type} and {w.type}")
    kernel = ctx.attr("kernel_shape")
    if kernel and tuple(kernel) != w.type.shape[2:]:
        raise ctx.error(f"kernel_shape {list(kernel)} does not match W {w.type}")


@converter("Conv")
def conv(ctx: NodeContext) -> Value:
    """N-d grouped, strided, dilated convolution; explicit or automatic pads; bias as a Map."""
    b, x, w = ctx.b, ctx.input(0), ctx.input(1)
    _check_conv_operands(ctx, x, w)
    geo = window(ctx, x.type.shape[2:], w.type.shape[2:])
    y = b.emit1(Conv(geo.strides, geo.dilations, geo.pads, ctx.attr("group", 1)), x, w)
    return add_channel_bias(b, y, ctx.optional_input(2))


def _transpose_pads(ctx: NodeContext, x: Value, w: Value, strides, dilations, output_padding) -> tuple[int, ...]:
    """Begin and end crops of a ConvTranspose's full output; negative means grow.

    With ``output_shape`` (or SAME auto_pad, whose output is ``in * stride``) the total
    crop is derived from the wanted size and split as the spec says: SAME_UPPER crops
    more at the end, everything else more at the beginning.
    """
    k = x.type.rank - 2
    sizes, kernel = x.type.shape[2:], w.type.shape[2:]
    full = [(sizes[i] - 1) * strides[i] + span(kernel[i], dilations[i]) + output_padding[i] for i in range(k)]
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise ctx.unsupported(f"auto_pad={auto_pad!r}")
    wanted = ctx.attr("output_shape")
    if not wanted and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        wanted = [sizes[i] * strides[i] for i in range(k)]
    if wanted:
        wanted = list(wanted)[-k:]  # some exporters write N and C too
        splits = []
        for i in range(k):
            total = full[i] - int(wanted[i])
            if total >= 0:
                splits.append(split_total(total, auto_pad == "SAME_UPPER"))
                continue
            # a wanted size past the full result grows it at the end, whatever auto_pad says, as
            # onnxruntime does; by a stride or more it is no output of this input (onnxruntime
            # refuses it too)
            if -total >= strides[i]:
                raise ctx.error(f"output_shape {int(wanted[i])} (spatial dim {i}) is {-total} past the full result "
                                f"{full[i]}, a stride ({strides[i]}) or more: no input of this size gives it")
            splits.append((0, total))
        return tuple(s[0] for s in splits) + tuple(s[1] for s in splits)
    if auto_pad == "VALID":
        return (0,) * (2 * k)
    pads = ctx.attr("pads") or [0] * (2 * k)
    if len(pads) != 2 * k:
        raise ctx.error(f"pads has {len(pads)} values, expected {2 * k}")
    return tuple(int(p) for p in pads)


@converter("ConvTranspose")
def conv_transpose(ctx: NodeContext) -> Value:
    """Transposed convolution. A negative crop (the wanted output is larger than the
    full result) becomes zero padding of the result, before the bias is added."""
    b, x, w = ctx.b, ctx.input(0), ctx.input(1)
    _check_conv_operands(ctx, x, w)
    k = x.type.rank - 2
    ones = [1] * k
    strides = tuple(ctx.attr("strides") or ones)
    dilations = tuple(ctx.attr("dilations") or ones)
    output_padding = tuple(ctx.attr("output_padding") or [0] * k)
    if not len(strides) == len(dilations) == len(output_padding) == k:
        raise ctx.error("strides, dilations and output_padding must have one value per spatial dim")
    pads = _transpose_pads(ctx, x, w, strides, dilations, output_padding)
    if strides == w.type.shape[2:] and dilations == tuple(ones) and not any(pads) and not any(output_padding) \
            and ctx.attr("group", 1) == 1:
        return add_channel_bias(b, _patch_product(b, x, w), ctx.optional_input(2))
    crop = tuple(max(0, p) for p in pads)
    op = ConvTranspose(strides, dilations, crop, output_padding, ctx.attr("group", 1))
    y = b.emit1(op, x, w)
    grow = tuple(max(0, -p) for p in pads)
    if any(grow):
        y = b.emit1(Pad((0, 0) + grow[:k] + (0, 0) + grow[k:]), y)
    return add_channel_bias(b, y, ctx.optional_input(2))


def _patch_product(b: Builder, x: Value, w: Value) -> Value:
    """A transposed convolution whose stride equals its kernel (U-Net's upsampling): the
    kernel's patches tile the output without overlap, so it is one product, ``pixels x C``
    by ``C x (M * taps)``, whose rows are scattered into patches by a reshape/transpose.
    A product with an epilogue of pure addressing, instead of a reduction over taps that
    mostly hit holes."""
    n, c, *sizes = x.type.shape
    m, kernel = w.type.shape[1], w.type.shape[2:]
    k = len(sizes)
    rows = b.reshape(b.transpose(x, (0, *range(2, 2 + k), 1)), (n * math.prod(sizes), c))
    y = b.matmul(rows, b.reshape(w, (c, m * math.prod(kernel))))
    y = b.reshape(y, (n, *sizes, m, *kernel))  # N, S..., M, K...
    perm = (0, 1 + k) + tuple(v for i in range(k) for v in (1 + i, 2 + k + i))  # N, M, S0, K0, S1, K1, ...
    return b.reshape(b.transpose(y, perm), (n, m, *(s * kk for s, kk in zip(sizes, kernel))))


# The rest of the family registers on import.
from tilefuse.frontend.converters import attention, einsum, norms, pooling  # noqa: E402,F401
