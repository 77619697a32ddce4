"""Element types of tensor values.

The compiler names dtypes with :class:`DType` everywhere; numpy dtypes appear only at
the edges (constants, the reference executor). bfloat16 comes from ml_dtypes.
"""
from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT64 = "float64"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype:
        return _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @property
    def is_float(self) -> bool:
        return self in FLOATS

    @property
    def is_int(self) -> bool:
        return self in INTS

    @property
    def is_signed(self) -> bool:
        return self in FLOATS or self in SIGNED_INTS

    @property
    def compute(self) -> "DType":
        """The dtype arithmetic on this dtype is carried out in (fp32 for half types)."""
        return DType.FLOAT32 if self in HALF_FLOATS else self

    @staticmethod
    def from_numpy(dtype: np.dtype | type) -> "DType":
        try:
            return _FROM_NUMPY[np.dtype(dtype)]
        except KeyError:
            raise TypeError(f"unsupported numpy dtype {np.dtype(dtype)}") from None

    def __str__(self) -> str:
        return self.value


HALF_FLOATS = frozenset({DType.FLOAT16, DType.BFLOAT16})
FLOATS = frozenset({DType.FLOAT32, DType.FLOAT64}) | HALF_FLOATS
SIGNED_INTS = frozenset({DType.INT8, DType.INT16, DType.INT32, DType.INT64})
UNSIGNED_INTS = frozenset({DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64})
INTS = SIGNED_INTS | UNSIGNED_INTS

_TO_NUMPY: dict[DType, np.dtype] = {
    DType.FLOAT32: np.dtype(np.float32),
    DType.FLOAT16: np.dtype(np.float16),
    DType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    DType.FLOAT64: np.dtype(np.float64),
    DType.INT8: np.dtype(np.int8),
    DType.INT16: np.dtype(np.int16),
    DType.INT32: np.dtype(np.int32),
    DType.INT64: np.dtype(np.int64),
    DType.UINT8: np.dtype(np.uint8),
    DType.UINT16: np.dtype(np.uint16),
    DType.UINT32: np.dtype(np.uint32),
    DType.UINT64: np.dtype(np.uint64),
    DType.BOOL: np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}


def widens_exactly(src: DType, dst: DType) -> bool:
    """True if every value of ``src`` is exactly a value of ``dst``: a cast from ``src``
    to ``dst`` loses nothing (fp16/bf16 -> fp32, int8 -> int32, uint8 -> fp16, bool -> any)."""
    if src is dst or src is DType.BOOL:
        return True
    if dst is DType.BOOL or (src.is_float and not dst.is_float):
        return False
    if src.is_int and dst.is_int:
        a, b = np.iinfo(src.numpy), np.iinfo(dst.numpy)
        return b.min <= a.min and a.max <= b.max
    f = ml_dtypes.finfo(dst.numpy)
    if src.is_int:  # integers up to 2**(mantissa bits + 1) are exact
        a = np.iinfo(src.numpy)
        return max(-int(a.min), int(a.max)) <= 2 ** (f.nmant + 1)
    e = ml_dtypes.finfo(src.numpy)  # floats: enough mantissa, exponent range and subnormals
    return f.nmant >= e.nmant and f.maxexp >= e.maxexp and f.minexp - f.nmant <= e.minexp - e.nmant


def widen_half(x: np.ndarray) -> np.ndarray:
    """Half floats as float32 (where onnxruntime computes them); other arrays unchanged."""
    return x.astype(np.float32) if x.dtype in (np.float16, _TO_NUMPY[DType.BFLOAT16]) else x
