"""Map: one scalar function applied elementwise over broadcast inputs.

Everything elementwise in ONNX becomes a short chain of Maps whose functions come from
:class:`ScalarFn`; parameters such as LeakyRelu's alpha become constant inputs, so a Map
has no parameters beyond its function (and the target dtype of a cast).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import scipy.special

from tilefuse.ir.dtypes import DType, widen_half
from tilefuse.ir.prims.base import Kind, Primitive
from tilefuse.ir.types import TensorType, broadcast_shapes, type_of


class Result(enum.Enum):
    SAME = "same"  # dtype of the first data input
    BOOL = "bool"
    CAST = "cast"  # Map.to


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C-style integer division (truncation toward zero), as ONNX Runtime does."""
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return np.where(fix, q + 1, q)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        with np.errstate(divide="ignore"):
            return _int_div(a, b)
    return np.divide(a, b)


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.mod(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return np.power(a, b.astype(a.dtype))
    return np.power(a, b.astype(a.dtype))


def _cast_rule(x: np.ndarray) -> np.ndarray:  # placeholder, never called
    raise AssertionError


@dataclass(frozen=True)
class _Fn:
    arity: int
    impl: Callable[..., np.ndarray]
    result: Result = Result.SAME
    flops: int = 1  # per output element; transcendental functions count more
    floats_only: bool = False


class ScalarFn(enum.Enum):
    """Scalar functions a Map applies. The value holds arity, numpy impl and rules."""

    # unary arithmetic
    NEG = _Fn(1, np.negative)
    ABS = _Fn(1, np.abs)
    SIGN = _Fn(1, np.sign)
    RECIPROCAL = _Fn(1, np.reciprocal, floats_only=True)
    SQRT = _Fn(1, np.sqrt, flops=4, floats_only=True)
    EXP = _Fn(1, np.exp, flops=8, floats_only=True)
    LOG = _Fn(1, np.log, flops=8, floats_only=True)
    FLOOR = _Fn(1, np.floor, floats_only=True)
    CEIL = _Fn(1, np.ceil, floats_only=True)
    ROUND = _Fn(1, np.round, floats_only=True)  # half to even, as ONNX specifies
    ERF = _Fn(1, scipy.special.erf, flops=16, floats_only=True)
    TANH = _Fn(1, np.tanh, flops=16, floats_only=True)
    SIGMOID = _Fn(1, scipy.special.expit, flops=10, floats_only=True)
    SIN = _Fn(1, np.sin, flops=16, floats_only=True)
    COS = _Fn(1, np.cos, flops=16, floats_only=True)
    TAN = _Fn(1, np.tan, flops=16, floats_only=True)
    ASIN = _Fn(1, np.arcsin, flops=16, floats_only=True)
    ACOS = _Fn(1, np.arccos, flops=16, floats_only=True)
    ATAN = _Fn(1, np.arctan, flops=16, floats_only=True)
    SINH = _Fn(1, np.sinh, flops=16, floats_only=True)
    COSH = _Fn(1, np.cosh, flops=16, floats_only=True)
    ASINH = _Fn(1, np.arcsinh, flops=16, floats_only=True)
    ACOSH = _Fn(1, np.arccosh, flops=16, floats_only=True)
    ATANH = _Fn(1, np.arctanh, flops=16, floats_only=True)
    ISNAN = _Fn(1, np.isnan, Result.BOOL, floats_only=True)
    ISINF = _Fn(1, np.isinf, Result.BOOL, floats_only=True)
    NOT = _Fn(1, np.logical_not)
    BITNOT = _Fn(1, np.invert)
    CAST = _Fn(1, _cast_rule, Result.CAST)
    # binary arithmetic
    ADD = _Fn(2, np.add)
    SUB = _Fn(2, np.subtract)
    MUL = _Fn(2, np.multiply)
    DIV = _Fn(2, _div)
    POW = _Fn(2, _pow, flops=16)
    MOD = _Fn(2, _mod)  # sign of the divisor (ONNX Mod, fmod=0)
    FMOD = _Fn(2, np.fmod)  # sign of the dividend (ONNX Mod, fmod=1)
    MAX = _Fn(2, np.maximum)
    MIN = _Fn(2, np.minimum)
    BITAND = _Fn(2, np.bitwise_and)
    BITOR = _Fn(2, np.bitwise_or)
    BITXOR = _Fn(2, np.bitwise_xor)
    SHL = _Fn(2, np.left_shift)
    SHR = _Fn(2, np.right_shift)
    # comparisons and logic
    EQ = _Fn(2, np.equal, Result.BOOL)
    LT = _Fn(2, np.less, Result.BOOL)
    LE = _Fn(2, np.less_equal, Result.BOOL)
    GT = _Fn(2, np.greater, Result.BOOL)
    GE = _Fn(2, np.greater_equal, Result.BOOL)
    AND = _Fn(2, np.logical_and, Result.BOOL)
    OR = _Fn(2, np.logical_or, Result.BOOL)
    XOR = _Fn(2, np.logical_xor, Result.BOOL)
    # selection
    WHERE = _Fn(3, np.where)

    @property
    def arity(self) -> int:
        return self.value.arity


# Functions whose inputs may differ in dtype (the others need equal dtypes).
_MIXED_INPUTS = {ScalarFn.POW, ScalarFn.WHERE, ScalarFn.CAST}


@dataclass(frozen=True, slots=True)
class Map(Primitive):
    fn: ScalarFn
    to: DType | None = None  # target dtype, for CAST only

    kind = Kind.MAP

    def __post_init__(self) -> None:
        if (self.fn is ScalarFn.CAST) != (self.to is not None):
            raise ValueError("Map.to is set exactly when fn is CAST")

    @property
    def name(self) -> str:
        return self.fn.name.lower()

    def params(self) -> dict[str, object]:
        return {"to": self.to} if self.to is not None else {}

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        if len(inputs) != self.fn.arity:
            raise TypeError(f"{self.name} takes {self.fn.arity} inputs, got {len(inputs)}")
        shape = broadcast_shapes(*(t.shape for t in inputs))
        data = inputs[1:] if self.fn is ScalarFn.WHERE else inputs
        if self.fn is ScalarFn.WHERE and inputs[0].dtype is not DType.BOOL:
            raise TypeError(f"where: condition must be bool, got {inputs[0].dtype}")
        if self.fn not in _MIXED_INPUTS and len({t.dtype for t in data}) > 1:
            raise TypeError(f"{self.name}: input dtypes differ: {[str(t.dtype) for t in data]}")
        if self.fn is ScalarFn.WHERE and data[0].dtype is not data[1].dtype:
            raise TypeError(f"where: branch dtypes differ: {data[0].dtype}, {data[1].dtype}")
        if self.fn.value.floats_only and not data[0].dtype.is_float:
            raise TypeError(f"{self.name} needs a float input, got {data[0].dtype}")
        result = self.fn.value.result
        dtype = {Result.SAME: data[0].dtype, Result.BOOL: DType.BOOL}.get(result, self.to)
        assert dtype is not None
        return (TensorType(dtype, shape),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        if self.fn is ScalarFn.CAST:
            return (cast_array(inputs[0], self.to),)  # type: ignore[arg-type]
        out_dtype = self.infer([type_of(x) for x in inputs])[0].dtype
        args = [widen_half(x) for x in inputs]
        with np.errstate(all="ignore"):
            y = np.asarray(self.fn.value.impl(*args))
        return (y.astype(out_dtype.numpy, copy=False),)

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        return self.fn.value.flops * outputs[0].size




def cast_array(x: np.ndarray, to: DType) -> np.ndarray:
    """ONNX Cast semantics for the supported dtypes."""
    if to is DType.BOOL:
        return (x != 0) if x.dtype != np.bool_ else x.copy()
    if x.dtype.kind == "f" or x.dtype == DType.BFLOAT16.numpy:
        if to.is_int:
            with np.errstate(invalid="ignore"):
                x = np.trunc(x.astype(np.float64))
        elif to is DType.BFLOAT16 and x.dtype != np.float32:
            x = x.astype(np.float32)
    with np.errstate(all="ignore"):
        return x.astype(to.numpy)
