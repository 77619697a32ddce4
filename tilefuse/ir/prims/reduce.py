"""Reductions: over axes, to an index (arg-reduce), and over sliding windows (pooling)."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from tilefuse.ir.dtypes import DType, widen_half
from tilefuse.ir.prims.base import Kind, Primitive, check_arity
from tilefuse.ir.types import TensorType


class ReduceFn(enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"

    def identity(self, dtype: np.dtype) -> int | float | bool:
        """The value of the reduction over an empty set (ONNX: -inf for max, ...)."""
        if self is ReduceFn.SUM:
            return 0
        if self is ReduceFn.PROD:
            return 1
        if dtype.kind in "iub":
            info = np.iinfo(dtype) if dtype.kind != "b" else None
            if info is None:
                return self is ReduceFn.MIN
            return info.min if self is ReduceFn.MAX else info.max
        return -np.inf if self is ReduceFn.MAX else np.inf


_NUMPY: dict[ReduceFn, Callable[..., np.ndarray]] = {ReduceFn.SUM: np.sum, ReduceFn.PROD: np.prod, ReduceFn.MAX: np.max, ReduceFn.MIN: np.min}


def _accumulate(x: np.ndarray, fn: ReduceFn) -> np.ndarray:
    """Sums and products of half floats accumulate in float32."""
    return widen_half(x) if fn in (ReduceFn.SUM, ReduceFn.PROD) else x


@dataclass(frozen=True, slots=True)
class Reduce(Primitive):
    """Reduce ``axes`` (sorted, non-negative, non-empty) with ``fn``."""

    fn: ReduceFn
    axes: tuple[int, ...]
    keepdims: bool

    kind = Kind.REDUCE
    arity = 1

    @property
    def name(self) -> str:
        return f"reduce_{self.fn.value}"

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        (x,) = inputs
        if not self.axes or list(self.axes) != sorted(set(self.axes)) or self.axes[-1] >= x.rank:
            raise ValueError(f"{self.name}: bad axes {self.axes} for rank {x.rank}")
        return (TensorType(x.dtype, _reduced_shape(x.shape, self.axes, self.keepdims)),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        (x,) = inputs
        initial = self.fn.identity(x.dtype) if x.size == 0 else None
        kwargs = {"initial": initial} if initial is not None else {}
        y = _NUMPY[self.fn](_accumulate(x, self.fn), axis=self.axes, keepdims=self.keepdims, **kwargs)
        return (np.asarray(y).astype(x.dtype, copy=False),)

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        return inputs[0].size


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


@dataclass(frozen=True, slots=True)
class WindowReduce(Primitive):
    """Reduce sliding windows over the trailing ``len(kernel)`` dims (pooling).

    ``pads`` is (begin..., end...) per spatial dim; padded positions hold the
    reduction's identity (0 for sum, -inf for max), so average pooling is a
    window sum times a constant reciprocal count computed by the frontend.
    """

    fn: ReduceFn
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]

    kind = Kind.REDUCE
    arity = 1

    @property
    def name(self) -> str:
        return f"window_{self.fn.value}"

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        (x,) = inputs
        k = len(self.kernel)
        if x.rank < k or not (len(self.strides) == len(self.dilations) == k and len(self.pads) == 2 * k):
            raise ValueError(f"{self.name}: parameters do not match input rank {x.rank}")
        spatial = tuple(
            _window_count(n, kk, s, d, self.pads[i] + self.pads[i + k])
            for i, (n, kk, s, d) in enumerate(zip(x.shape[-k:], self.kernel, self.strides, self.dilations))
        )
        return (TensorType(x.dtype, x.shape[:-k] + spatial),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        (x,) = inputs
        k = len(self.kernel)
        lead = x.ndim - k
        fill = self.fn.identity(x.dtype)
        pad = [(0, 0)] * lead + [(self.pads[i], self.pads[i + k]) for i in range(k)]
        xp = np.pad(_accumulate(x, self.fn), pad, constant_values=fill)
        windows = sliding_windows(xp, self.kernel, self.strides, self.dilations)
        axes = tuple(range(x.ndim, x.ndim + k))
        y = _NUMPY[self.fn](windows, axis=axes)
        return (np.asarray(y).astype(x.dtype, copy=False),)

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        return outputs[0].size * math.prod(self.kernel)


def _window_count(n: int, k: int, stride: int, dilation: int, pad: int) -> int:
    span = (k - 1) * dilation + 1
    return max(0, (n + pad - span) // stride + 1)


def sliding_windows(
    x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
) -> np.ndarray:
    """A view ``[..., *out_spatial, *kernel]`` of the windows over x's trailing dims."""
    k = len(kernel)
    spans = [(kk - 1) * d + 1 for kk, d in zip(kernel, dilations)]
    axes = tuple(range(x.ndim - k, x.ndim))
    w = np.lib.stride_tricks.sliding_window_view(x, spans, axis=axes)
    index = (
        (Ellipsis,)
        + tuple(slice(None, None, s) for s in strides)
        + tuple(slice(None, None, d) for d in dilations)
    )
    # The view is [..., *positions, *spans]; step positions by strides, spans by dilations.
    lead = x.ndim - k
    full = tuple([slice(None)] * lead) + index[1:]
    return w[full]
