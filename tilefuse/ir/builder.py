"""Building graphs: append primitives, infer types, fold constants as you go.

Every primitive whose inputs are all constant is evaluated at once with its numpy
reference (unless the result would be much larger than its inputs), so shape
arithmetic such as ``Shape -> Gather -> Concat -> Reshape`` disappears while a model
is imported, and what reaches the compiler is only the work that depends on inputs.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Graph, Node, Value
from tilefuse.ir.prims import (
    Broadcast,
    Concat,
    Map,
    MatMul,
    Primitive,
    Reduce,
    ReduceFn,
    Reshape,
    ScalarFn,
    Slice,
    Transpose,
)
from tilefuse.ir.types import TensorType

# Fold a constant expression unless its result is larger than this and than twice its
# inputs (a broadcast scalar would otherwise become a large weight).
FOLD_MIN_BYTES = 1 << 16


class Builder:
    def __init__(self, name: str, *, fold: bool = True) -> None:
        self.graph = Graph(name)
        self.fold = fold
        self.origin = ""  # the source node being converted, recorded on each new node
        self._names: set[str] = set()
        self._count = 0

    # -- values ---------------------------------------------------------------------
    def unique(self, hint: str) -> str:
        name = hint or "v"
        while name in self._names:
            self._count += 1
            name = f"{hint}_{self._count}"
        self._names.add(name)
        return name

    def input(self, name: str, type: TensorType) -> Value:
        v = Value(self.unique(name), type)
        self.graph.inputs.append(v)
        return v

    def const(self, data: np.ndarray | np.generic | float | int | bool, dtype: DType | None = None, name: str = "") -> Value:
        array = np.asarray(data, dtype=dtype.numpy if dtype else None)
        if dtype is None and array.dtype == np.float64 and not isinstance(data, np.ndarray):
            array = array.astype(np.float32)  # Python floats default to float32
        array = np.array(array, order="C")  # a copy the caller cannot mutate; keeps 0-d arrays 0-d
        array.setflags(write=False)
        t = TensorType(DType.from_numpy(array.dtype), tuple(int(d) for d in array.shape))
        return Value(self.unique(name or "const"), t, data=array)

    def scalar_like(self, value: float | int | bool, like: Value) -> Value:
        return self.const(np.array(value).astype(like.type.dtype.numpy))

    def output(self, name: str, value: Value) -> None:
        self.graph.outputs[name] = value

    # -- primitives -----------------------------------------------------------------
    def emit(self, op: Primitive, inputs: Sequence[Value], hint: str = "") -> tuple[Value, ...]:
        out_types = op.infer([v.type for v in inputs])
        if self.fold and inputs and all(v.is_constant for v in inputs) and _worth_folding(inputs, out_types):
            arrays = op.evaluate([v.data for v in inputs])  # type: ignore[misc]
            return tuple(self.const(a, t.dtype, name=hint or op.name) for a, t in zip(arrays, out_types))
        base = hint or f"{self.origin or 'n'}/{op.name}"
        node = Node(op, tuple(inputs), (), self.unique(base), self.origin)
        node.outputs = tuple(
            Value(self.unique(f"{base}:{i}" if len(out_types) > 1 else base), t, producer=node)
            for i, t in enumerate(out_types)
        )
        for v in inputs:
            v.users.append(node)
        self.graph.nodes.append(node)
        return node.outputs

    def emit1(self, op: Primitive, *inputs: Value, hint: str = "") -> Value:
        (out,) = self.emit(op, inputs, hint)
        return out

    # -- conveniences used by converters ------------------------------------------------
    def map(self, fn: ScalarFn, *xs: Value) -> Value:
        return self.emit1(Map(fn), *xs)

    def cast(self, x: Value, to: DType) -> Value:
        return x if x.type.dtype is to else self.emit1(Map(ScalarFn.CAST, to), x)

    def reduce(self, fn: ReduceFn, x: Value, axes: Sequence[int], keepdims: bool) -> Value:
        axes = tuple(sorted({a % x.type.rank for a in axes})) if x.type.rank else ()
        if not axes:
            return x
        return self.emit1(Reduce(fn, axes, keepdims), x)

    def matmul(self, a: Value, b: Value) -> Value:
        return self.emit1(MatMul(), a, b)

    def transpose(self, x: Value, perm: Sequence[int]) -> Value:
        perm = tuple(perm)
        return x if perm == tuple(range(len(perm))) else self.emit1(Transpose(perm), x)

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(d) for d in shape)
        return x if shape == x.type.shape else self.emit1(Reshape(shape), x)

    def broadcast(self, x: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(d) for d in shape)
        return x if shape == x.type.shape else self.emit1(Broadcast(shape), x)

    def concat(self, xs: Sequence[Value], axis: int) -> Value:
        return xs[0] if len(xs) == 1 else self.emit1(Concat(axis), *xs)

    def slice(self, x: Value, axis: int, start: int, stop: int, step: int = 1) -> Value:
        """``x[start:stop:step]`` along ``axis`` with Python semantics for in-range bounds."""
        n = x.type.shape[axis]
        start, stop, step = slice(start, stop, step).indices(n)
        count = len(range(start, stop, step))
        if count == n and step == 1:
            return x
        starts = [0] * x.type.rank
        steps = [1] * x.type.rank
        counts = list(x.type.shape)
        starts[axis], steps[axis], counts[axis] = (start if count else 0), step, count
        return self.emit1(Slice(tuple(starts), tuple(steps), tuple(counts)), x)


def _worth_folding(inputs: Sequence[Value], outputs: Sequence[TensorType]) -> bool:
    in_bytes = sum(v.type.nbytes for v in inputs)
    out_bytes = sum(t.nbytes for t in outputs)
    return out_bytes <= max(FOLD_MIN_BYTES, 2 * in_bytes)
