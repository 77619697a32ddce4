"""Opaque primitives: run by their numpy reference, never fused, always reported.

Each is a small class with static parameters, so plans can name it without Python code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tilefuse.ir.dtypes import DType, widen_half
from tilefuse.ir.prims.base import Kind, Primitive, check_arity
from tilefuse.ir.types import TensorType


class _OpaquePrimitive(Primitive):
    kind = Kind.OPAQUE

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        return sum(t.size for t in inputs)


@dataclass(frozen=True, slots=True)
class TopK(_OpaquePrimitive):
    """The k largest (or smallest) along ``axis``: outputs values and int64 indices."""

    axis: int
    k: int
    largest: bool = True
    sorted: bool = True
    arity = 1
    num_outputs = 2

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        (x,) = inputs
        if not 0 <= self.axis < x.rank or not 0 <= self.k <= x.shape[self.axis]:
            raise ValueError(f"topk: k={self.k} or axis={self.axis} invalid for {x}")
        shape = x.shape[: self.axis] + (self.k,) + x.shape[self.axis + 1 :]
        return TensorType(x.dtype, shape), TensorType(DType.INT64, shape)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        (x,) = inputs
        # NaN ranks above everything, +inf included (onnxruntime and onnx's reference):
        # first for largest, last for smallest. A negated key alone would put NaN last
        # both ways. lexsort is stable, which gives ONNX's tie rule: lower index first.
        key = x.astype(np.float64)
        nan = np.isnan(key)
        key = np.where(nan, 0.0, -key if self.largest else key)
        order = np.lexsort((key, ~nan if self.largest else nan), axis=self.axis)
        idx = np.take(order, np.arange(self.k), axis=self.axis)
        return np.take_along_axis(x, idx, axis=self.axis), idx.astype(np.int64)


class _Scan(_OpaquePrimitive):
    """A running reduction along ``axis`` (fields ``axis``, ``exclusive``, ``reverse``);
    half floats accumulate in float32. Subclasses give the scan itself."""

    arity = 1

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        (x,) = inputs
        if not 0 <= self.axis < x.rank:  # type: ignore[attr-defined]
            raise ValueError(f"{self.name.lower()}: axis {self.axis} out of range for {x}")  # type: ignore[attr-defined]
        return (x,)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        (x,) = inputs
        acc = widen_half(x)
        if self.reverse:  # type: ignore[attr-defined]
            acc = np.flip(acc, self.axis)  # type: ignore[attr-defined]
        y = self._scan(acc)
        if self.reverse:  # type: ignore[attr-defined]
            y = np.flip(y, self.axis)  # type: ignore[attr-defined]
        return (np.ascontiguousarray(y).astype(x.dtype, copy=False),)

    def _scan(self, acc: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class CumSum(_Scan):
    axis: int
    exclusive: bool = False
    reverse: bool = False

    def _scan(self, acc: np.ndarray) -> np.ndarray:
        y = np.cumsum(acc, axis=self.axis, dtype=acc.dtype)
        return y - acc if self.exclusive else y


@dataclass(frozen=True, slots=True)
class CumProd(_Scan):
    """Running product along ``axis``; ``exclusive`` leaves each element out of its own
    product (the first is 1), ``reverse`` runs from the end."""

    axis: int
    exclusive: bool = False
    reverse: bool = False

    def _scan(self, acc: np.ndarray) -> np.ndarray:
        if self.exclusive:
            # Shift by one along the axis, a 1 first (no division: zeros stay exact).
            n = acc.shape[self.axis]
            ones = np.ones_like(np.take(acc, [0], axis=self.axis))
            acc = np.concatenate([ones, np.take(acc, np.arange(max(n - 1, 0)), axis=self.axis)], axis=self.axis)
        with np.errstate(over="ignore"):
            return np.cumprod(acc, axis=self.axis, dtype=acc.dtype)
