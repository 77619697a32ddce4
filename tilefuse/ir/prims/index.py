"""Index primitives: pure data movement, each an index map from output to input.

Inside a fusion group these cost no bytes: they become address arithmetic. Everything
that only moves data (Squeeze, Flatten, Split, Tile, DepthToSpace, ...) is expressed by
the frontend with these few.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims.base import Kind, Primitive, check_arity
from tilefuse.ir.types import Shape, TensorType, broadcast_shapes, type_of


class _IndexPrimitive(Primitive):
    kind = Kind.INDEX

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class Transpose(_IndexPrimitive):
    perm: tuple[int, ...]
    arity = 1

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        (x,) = inputs
        if sorted(self.perm) != list(range(x.rank)):
            raise ValueError(f"transpose: perm {self.perm} is not a permutation of rank {x.rank}")
        return (TensorType(x.dtype, tuple(x.shape[p] for p in self.perm)),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        return (np.ascontiguousarray(np.transpose(inputs[0], self.perm)),)


@dataclass(frozen=True, slots=True)
class Reshape(_IndexPrimitive):
    shape: Shape
    arity = 1

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        (x,) = inputs
        if math.prod(self.shape) != x.size:
            raise ValueError(f"reshape: cannot reshape {x} to {self.shape}")
        return (TensorType(x.dtype, self.shape),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        return (inputs[0].reshape(self.shape),)


@dataclass(frozen=True, slots=True)
class Slice(_IndexPrimitive):
    """Per axis of the input: ``y[i] = x[start + i * step]`` for ``i < count``."""

    starts: tuple[int, ...]
    steps: tuple[int, ...]
    counts: tuple[int, ...]
    arity = 1

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        (x,) = inputs
        if not len(self.starts) == len(self.steps) == len(self.counts) == x.rank:
            raise ValueError(f"slice: parameters do not match rank {x.rank}")
        for n, s, st, c in zip(x.shape, self.starts, self.steps, self.counts):
            if c and not (0 <= s < n and 0 <= s + (c - 1) * st < n) or st == 0:
                raise ValueError(f"slice: out of bounds for {x}: {self}")
        return (TensorType(x.dtype, self.counts),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        index = []
        for s, st, c in zip(self.starts, self.steps, self.counts):
            if c == 0:
                index.append(slice(0, 0))
                continue
            stop = s + c * st
            index.append(slice(s, stop if stop >= 0 else None, st))
        return (np.ascontiguousarray(inputs[0][tuple(index)]),)


@dataclass(frozen=True, slots=True)
class Broadcast(_IndexPrimitive):
    """Expand to ``shape`` by numpy broadcasting (ONNX Expand after resolving its rule)."""

    shape: Shape
    arity = 1

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        (x,) = inputs
        if broadcast_shapes(x.shape, self.shape) != self.shape:
            raise ValueError(f"broadcast: {x} does not broadcast to {self.shape}")
        return (TensorType(x.dtype, self.shape),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        return (np.ascontiguousarray(np.broadcast_to(inputs[0], self.shape)),)


@dataclass(frozen=True, slots=True)
class Concat(_IndexPrimitive):
    axis: int

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        if not inputs:
            raise ValueError("concat needs at least one input")
        first = inputs[0]
        for t in inputs:
            same = t.rank == first.rank and all(
                a == b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != self.axis
            )
            if not same or t.dtype is not first.dtype or not 0 <= self.axis < t.rank:
                raise ValueError(f"concat: inputs do not match on axis {self.axis}: {[str(x) for x in inputs]}")
        shape = list(first.shape)
        shape[self.axis] = sum(t.shape[self.axis] for t in inputs)
        return (TensorType(first.dtype, tuple(shape)),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        return (np.concatenate(list(inputs), axis=self.axis),)


class PadMode(enum.Enum):
    CONSTANT = "constant"
    REFLECT = "reflect"
    EDGE = "edge"
    WRAP = "wrap"


@dataclass(frozen=True, slots=True)
class Pad(_IndexPrimitive):
    """Pad by non-negative (begin..., end...) amounts; ``value`` fills constant mode."""

    pads: tuple[int, ...]
    mode: PadMode = PadMode.CONSTANT
    value: float | int | bool = 0
    arity = 1

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        (x,) = inputs
        r = x.rank
        if len(self.pads) != 2 * r or min(self.pads, default=0) < 0:
            raise ValueError(f"pad: pads {self.pads} do not fit rank {r}")
        return (TensorType(x.dtype, tuple(d + self.pads[i] + self.pads[i + r] for i, d in enumerate(x.shape))),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        (x,) = inputs
        r = x.ndim
        width = [(self.pads[i], self.pads[i + r]) for i in range(r)]
        if self.mode is PadMode.CONSTANT:
            return (np.pad(x, width, constant_values=np.array(self.value).astype(x.dtype)),)
        return (np.pad(x, width, mode=self.mode.value),)


def _normalize_indices(idx: np.ndarray, dim: int | np.ndarray) -> np.ndarray:
    """ONNX indices into an axis of ``dim`` (per coordinate on the last axis, for the ND
    ops): in [-dim, dim), negative ones counting from the end; IndexError otherwise."""
    idx = idx.astype(np.int64)
    bad = (idx < -dim) | (idx >= dim)
    if np.any(bad):
        at = np.argwhere(bad)[0]
        n = int(np.broadcast_to(dim, idx.shape)[tuple(at)])
        raise IndexError(f"indices hold {int(idx[tuple(at)])}, outside [-{n}, {n})")
    return np.where(idx < 0, idx + dim, idx)


def _check_indices(t: TensorType, what: str) -> None:
    if t.dtype not in (DType.INT32, DType.INT64):
        raise TypeError(f"{what}: indices must be int32 or int64, got {t.dtype}")


@dataclass(frozen=True, slots=True)
class Gather(_IndexPrimitive):
    """ONNX Gather: ``data[..., indices, ...]`` on ``axis``; negative indices wrap."""

    axis: int
    arity = 2

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        data, idx = inputs
        _check_indices(idx, "gather")
        if not 0 <= self.axis < data.rank:
            raise ValueError(f"gather: axis {self.axis} out of range for {data}")
        shape = data.shape[: self.axis] + idx.shape + data.shape[self.axis + 1 :]
        return (TensorType(data.dtype, shape),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        data, idx = inputs
        idx = _normalize_indices(idx, data.shape[self.axis])
        return (np.take(data, idx, axis=self.axis),)


@dataclass(frozen=True, slots=True)
class GatherElements(_IndexPrimitive):
    axis: int
    arity = 2

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        data, idx = inputs
        _check_indices(idx, "gather_elements")
        if idx.rank != data.rank or not 0 <= self.axis < data.rank:
            raise ValueError(f"gather_elements: ranks differ or bad axis: {data}, {idx}")
        return (TensorType(data.dtype, idx.shape),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        data, idx = inputs
        idx = _normalize_indices(idx, data.shape[self.axis])
        return (np.take_along_axis(data, idx, axis=self.axis),)


@dataclass(frozen=True, slots=True)
class GatherND(_IndexPrimitive):
    batch_dims: int = 0
    arity = 2

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        data, idx = inputs
        _check_indices(idx, "gather_nd")
        b, last = self.batch_dims, idx.shape[-1] if idx.rank else 0
        if idx.rank < 1 or last > data.rank - b or data.shape[:b] != idx.shape[:b]:
            raise ValueError(f"gather_nd: incompatible data {data} and indices {idx}")
        return (TensorType(data.dtype, idx.shape[:-1] + data.shape[b + last :]),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        data, idx = inputs
        b = self.batch_dims
        (out_t,) = self.infer([type_of(data), type_of(idx)])
        batch = math.prod(data.shape[:b])
        d = data.reshape((batch,) + data.shape[b:])
        ix = idx.reshape((batch, -1, idx.shape[-1]))
        last = idx.shape[-1]
        dims = np.array(data.shape[b : b + last])
        ix = _normalize_indices(ix, dims)
        rows = [d[i][tuple(ix[i].T)] for i in range(batch)]
        return (np.stack(rows).reshape(out_t.shape) if rows else np.zeros(out_t.shape, data.dtype),)


class ScatterReduction(enum.Enum):
    NONE = "none"
    ADD = "add"
    MUL = "mul"
    MAX = "max"
    MIN = "min"


_UFUNC = {
    ScatterReduction.ADD: np.add,
    ScatterReduction.MUL: np.multiply,
    ScatterReduction.MAX: np.maximum,
    ScatterReduction.MIN: np.minimum,
}


@dataclass(frozen=True, slots=True)
class ScatterND(_IndexPrimitive):
    """``data`` with ``updates`` written (or combined) at ``indices``; inputs (data, indices, updates)."""

    reduction: ScatterReduction = ScatterReduction.NONE
    arity = 3

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        data, idx, upd = inputs
        _check_indices(idx, "scatter_nd")
        last = idx.shape[-1] if idx.rank else 0
        if idx.rank < 1 or last > data.rank or upd.shape != idx.shape[:-1] + data.shape[last:]:
            raise ValueError(f"scatter_nd: incompatible {data}, {idx}, {upd}")
        return (data,)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        data, idx, upd = inputs
        out = data.copy()
        last = idx.shape[-1]
        ix = _normalize_indices(idx.reshape(-1, last), np.array(data.shape[:last]))
        u = upd.reshape((ix.shape[0],) + data.shape[last:])
        for i, where in enumerate(map(tuple, ix)):
            if self.reduction is ScatterReduction.NONE:
                out[where] = u[i]
            else:
                out[where] = _UFUNC[self.reduction](out[where], u[i])
        return (out,)


@dataclass(frozen=True, slots=True)
class ScatterElements(_IndexPrimitive):
    axis: int
    reduction: ScatterReduction = ScatterReduction.NONE
    arity = 3

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        data, idx, upd = inputs
        _check_indices(idx, "scatter_elements")
        if idx.shape != upd.shape or idx.rank != data.rank or not 0 <= self.axis < data.rank:
            raise ValueError(f"scatter_elements: incompatible {data}, {idx}, {upd}")
        return (data,)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        data, idx, upd = inputs
        out = data.copy()
        idx = _normalize_indices(idx, data.shape[self.axis])
        grid: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
        grid[self.axis] = idx
        where = tuple(np.broadcast_arrays(*grid))
        if self.reduction is ScatterReduction.NONE:
            out[where] = upd
        else:
            _UFUNC[self.reduction].at(out, where, upd)
        return (out,)

