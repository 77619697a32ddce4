"""Tensor types: a dtype and a static shape."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tilefuse.ir.dtypes import DType

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TensorType:
    """The type of a value: every dim is a known non-negative int."""

    dtype: DType
    shape: Shape

    def __post_init__(self) -> None:
        if not all(isinstance(d, int) and d >= 0 for d in self.shape):
            raise ValueError(f"shape must be static non-negative ints, got {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


def broadcast_shapes(*shapes: Shape) -> Shape:
    """Numpy (multidirectional) broadcasting; raises ValueError if incompatible."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"shapes {list(shapes)} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def type_of(array: np.ndarray) -> TensorType:
    """The TensorType of a numpy array (for primitives' numpy references)."""
    return TensorType(DType.from_numpy(array.dtype), tuple(int(d) for d in array.shape))
