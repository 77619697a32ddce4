"""Ops that make tensors from shapes and constants: Shape, Size, Constant, Range, ...

Shapes are static in tilefuse, so Shape and Size are constants, and everything
computed from them (ConstantOfShape, Range, the usual Shape -> Gather -> Concat ->
Reshape chains) folds away while the model is imported. Also here: the small helpers
the other movement modules share (axis normalisation, compile-time int operands).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from tilefuse.frontend.context import NodeContext, NotConstantError, onnx_dtype
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import ScalarFn as F

# -- helpers shared by the movement converters ------------------------------------------


def normalize_axis(ctx: NodeContext, axis: int, rank: int) -> int:
    """``axis`` in ``[-rank, rank)`` as a non-negative axis; a conversion error otherwise."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(ctx: NodeContext, axes: Sequence[int], rank: int) -> list[int]:
    """Normalised axes; repeated axes are an error, as the spec says."""
    out = [normalize_axis(ctx, a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ctx.error(f"axes {list(axes)} repeat an axis")
    return out


def const_ints(ctx: NodeContext, i: int) -> list[int] | None:
    """Optional input ``i`` as a list of Python ints (it must be a compile-time constant)."""
    array = ctx.optional_const_input(i)
    return None if array is None else [int(v) for v in array.reshape(-1)]


def const_operand(ctx: NodeContext, i: int, why: str) -> np.ndarray:
    """Input ``i`` as a constant; if it is computed at run time, the error says ``why``
    it must not be (and which graph inputs to bind to make it constant)."""
    try:
        return ctx.const_input(i)
    except NotConstantError as e:
        raise NotConstantError(f"{e} ({why}: data-dependent output shape)", e.graph_inputs, e.node) from None


def ints_operand(ctx: NodeContext, input_index: int, attr_name: str) -> list[int] | None:
    """An int-list operand that older opsets pass as an attribute and newer ones as an input."""
    if ctx.has_attr(attr_name):
        return [int(v) for v in ctx.attr(attr_name)]
    return const_ints(ctx, input_index)


def tensor_to_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    """An ONNX tensor as numpy, with bfloat16 as ml_dtypes' bfloat16."""
    dtype = onnx_dtype(t.data_type, what)
    array = numpy_helper.to_array(t)
    if dtype is DType.BFLOAT16 and array.dtype != DType.BFLOAT16.numpy:
        array = array.view(DType.BFLOAT16.numpy) if array.dtype.itemsize == 2 else array.astype(DType.BFLOAT16.numpy)
    return array


def iota(b: Builder, n: int, shape: Sequence[int]) -> Value:
    """``arange(n)`` as an int64 constant reshaped to ``shape`` (which holds n elements)."""
    return b.const(np.arange(n, dtype=np.int64).reshape(tuple(shape)))


# -- converters ------------------------------------------------------------------------


@converter("Shape")
def shape(ctx: NodeContext) -> Value:
    # Shapes are static: the result is a constant, whatever computes the input.
    dims = ctx.input(0).type.shape
    rank = len(dims)
    start, end = ctx.attr("start", 0), ctx.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return ctx.b.const(np.array(dims[start:end], dtype=np.int64))


@converter("Size")
def size(ctx: NodeContext) -> Value:
    return ctx.b.const(np.array(ctx.input(0).type.size, dtype=np.int64))


@converter("ConstantOfShape", since=9)
def constant_of_shape(ctx: NodeContext) -> Value:
    dims = const_ints(ctx, 0) or []
    proto = ctx.attr("value")
    what = f"ConstantOfShape node {ctx.label!r}"
    fill = tensor_to_array(proto, what) if proto is not None else np.zeros(1, np.float32)
    if fill.size != 1:
        raise ctx.error(f"value must hold one element, got {fill.size}")
    if any(d < 0 for d in dims):
        raise ctx.error(f"negative dimension in shape {dims}")
    # A broadcast scalar: the builder folds it when small and keeps it as a Broadcast
    # node (not a large weight) otherwise.
    return ctx.b.broadcast(ctx.b.const(fill.reshape(())), dims)


@converter("Constant")
def constant(ctx: NodeContext) -> Value:
    b, what = ctx.b, f"Constant node {ctx.label!r}"
    if ctx.has_attr("value"):
        return b.const(tensor_to_array(ctx.attr("value"), what))
    if ctx.has_attr("sparse_value"):
        return b.const(_sparse_to_dense(ctx.attr("sparse_value"), what))
    if ctx.has_attr("value_float"):
        return b.const(np.array(ctx.attr("value_float"), dtype=np.float32))
    if ctx.has_attr("value_floats"):
        return b.const(np.array(ctx.attr("value_floats"), dtype=np.float32))
    if ctx.has_attr("value_int"):
        return b.const(np.array(ctx.attr("value_int"), dtype=np.int64))
    if ctx.has_attr("value_ints"):
        return b.const(np.array(ctx.attr("value_ints"), dtype=np.int64))
    if ctx.has_attr("value_string") or ctx.has_attr("value_strings"):
        raise ctx.unsupported("string constants")
    raise ctx.error("no value attribute")


def _sparse_to_dense(sparse: onnx.SparseTensorProto, what: str) -> np.ndarray:
    values = tensor_to_array(sparse.values, what)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 1:  # linearised indices
        dense.reshape(-1)[indices] = values
    else:  # one row of coordinates per value
        dense[tuple(indices.T)] = values
    return dense


@converter("Range", since=11)
def range_(ctx: NodeContext) -> Value:
    # The output length depends on the operands' values: they must be constants.
    start, limit, delta = (ctx.const_input(i).reshape(()) for i in range(3))
    dtype = start.dtype
    if dtype.kind in "iu":
        first, stop, step = int(start), int(limit), int(delta)
        if step == 0:
            raise ctx.error("delta must not be zero")
        count = max(-(-(stop - first) // step), 0)  # exact ceil division
        values = first + np.arange(count, dtype=np.int64) * step
        return ctx.b.const(values.astype(dtype))
    # Half floats compute in stash_type (float32 by default) from opset 27, and in
    # double before, as the reference does.
    stash = ctx.attr("stash_type", 1) if ctx.opset >= 27 and dtype.itemsize == 2 else onnx.TensorProto.DOUBLE
    compute = np.dtype(np.float32 if stash == onnx.TensorProto.FLOAT else np.float64)
    low, high, inc = (np.asarray(v).astype(compute) for v in (start, limit, delta))
    if inc == 0:
        raise ctx.error("delta must not be zero")
    count = max(int(np.ceil((float(high) - float(low)) / float(inc))), 0)
    return ctx.b.const((low + np.arange(count, dtype=compute) * inc).astype(dtype))


@converter("EyeLike", since=9)
def eye_like(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    if x.type.rank != 2:
        raise ctx.error(f"input must be 2-D, got {x.type}")
    to = ctx.attr("dtype")
    dtype = onnx_dtype(to, f"EyeLike node {ctx.label!r}") if to is not None else x.type.dtype
    n, m = x.type.shape
    # col - row == k, computed from two small iotas: a constant when small, and a
    # cheap fused expression (not a large weight) otherwise.
    on_diag = b.map(F.EQ, b.map(F.SUB, iota(b, m, (1, m)), iota(b, n, (n, 1))), b.const(np.int64(ctx.attr("k", 0))))
    return b.cast(on_diag, dtype)


@converter("Trilu", since=14)
def trilu(ctx: NodeContext) -> Value:
    b, x = ctx.b, ctx.input(0)
    if x.type.rank < 2:
        raise ctx.error(f"input must have rank >= 2, got {x.type}")
    given = ctx.optional_const_input(1)
    k = 0 if given is None else int(given.reshape(()))
    n, m = x.type.shape[-2:]
    diagonal = b.map(F.SUB, iota(b, m, (1, m)), iota(b, n, (n, 1)))  # col - row
    keep = b.map(F.GE if ctx.attr("upper", 1) else F.LE, diagonal, b.const(np.int64(k)))
    return b.map(F.WHERE, keep, x, b.scalar_like(0, x))


@converter("OneHot", since=9)
def one_hot(ctx: NodeContext) -> Value:
    b, indices, values = ctx.b, ctx.input(0), ctx.input(2)
    depth = int(ctx.const_input(1).reshape(-1)[0])
    if depth < 0:
        raise ctx.error(f"depth must be non-negative, got {depth}")
    rank = indices.type.rank + 1
    axis = normalize_axis(ctx, ctx.attr("axis", -1), rank)
    # Float indices are truncated toward zero (as ONNX Runtime casts them).
    idx = b.cast(indices, DType.INT64)
    negative = b.map(F.LT, idx, b.const(np.int64(0)))
    idx = b.map(F.WHERE, negative, b.map(F.ADD, idx, b.const(np.int64(depth))), idx)
    idx = b.reshape(idx, indices.type.shape[:axis] + (1,) + indices.type.shape[axis:])
    classes = iota(b, depth, [depth if a == axis else 1 for a in range(rank)])
    hot = b.map(F.EQ, idx, classes)  # out-of-range indices match no class: all off
    off, on = _two_scalars(b, values)
    return b.map(F.WHERE, hot, on, off)


def _two_scalars(b: Builder, values: Value) -> tuple[Value, Value]:
    """``values[0]`` and ``values[1]`` as scalars (OneHot's off and on values)."""
    flat = b.reshape(values, (values.type.size,))
    return b.reshape(b.slice(flat, 0, 0, 1), ()), b.reshape(b.slice(flat, 0, 1, 2), ())


@converter("NonZero", since=9)
def non_zero(ctx: NodeContext) -> Value:
    # The output's length is the number of non-zeros: the input must be a constant.
    data = const_operand(ctx, 0, "NonZero's output shape depends on its input's values")
    if data.ndim == 0:  # the spec's shape (rank, count) for a scalar: (0, 0 or 1)
        return ctx.b.const(np.zeros((0, int(data != 0)), dtype=np.int64))
    return ctx.b.const(np.array(np.nonzero(data), dtype=np.int64))
