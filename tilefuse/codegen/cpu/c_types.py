"""How each DType lives in C: its storage type, the type arithmetic on it is done in,
literals, and the conversions between them.

A value in generated code is always held in its dtype's *compute* type: half floats as
``float`` (already rounded to half precision, so every value is one the half type can
hold), bool as ``int`` 0/1, everything else as itself. Conversions follow ONNX Cast as
the reference implements it (``tilefuse.ir.prims.map.cast_array``): float to int
truncates, anything to bool is ``!= 0``, float64 to bfloat16 goes through float32.
"""
from __future__ import annotations

import math

import numpy as np

from tilefuse.ir.dtypes import HALF_FLOATS, DType

STORAGE = {
    DType.FLOAT32: "float", DType.FLOAT64: "double", DType.FLOAT16: "_Float16", DType.BFLOAT16: "uint16_t",
    DType.INT8: "int8_t", DType.INT16: "int16_t", DType.INT32: "int32_t", DType.INT64: "int64_t",
    DType.UINT8: "uint8_t", DType.UINT16: "uint16_t", DType.UINT32: "uint32_t", DType.UINT64: "uint64_t",
    DType.BOOL: "uint8_t",
}


def storage(d: DType) -> str:
    """The C type of a buffer element."""
    return STORAGE[d]


def compute(d: DType) -> str:
    """The C type values of ``d`` are held and computed in."""
    if d in HALF_FLOATS:
        return "float"
    if d is DType.BOOL:
        return "int"
    return STORAGE[d]


def unsigned_wide(d: DType) -> str:
    """Unsigned type for wrap-around integer arithmetic on ``d`` (signed overflow is UB in C)."""
    return "uint64_t" if d.itemsize == 8 else "uint32_t"


def literal(value: float | int | bool, d: DType) -> str:
    """``value`` rounded to ``d``, as a C literal of ``compute(d)``."""
    if d is DType.BOOL:
        return "1" if bool(value) else "0"
    if d.is_float:
        if d is DType.FLOAT64:
            x = float(value)
            text, suffix = repr(x), ""
        else:
            x = float(np.asarray(value).astype(d.numpy).astype(np.float32))
            text, suffix = str(np.float32(x)), "f"
        if math.isnan(x):
            return "NAN" if suffix else "((double)NAN)"
        if math.isinf(x):
            inf = "INFINITY" if suffix else "((double)INFINITY)"
            return inf if x > 0 else f"(-{inf})"
        if "e" not in text and "." not in text:
            text += ".0"
        return f"{text}{suffix}" if not text.startswith("-") else f"({text}{suffix})"
    v = int(np.asarray(value).astype(d.numpy))  # wraps like numpy's astype
    if d.is_signed:
        if v == -(2**63):
            return "INT64_MIN"
        text = f"INT64_C({v})" if not -(2**31) < v < 2**31 else str(v)
    else:
        text = f"UINT64_C({v})" if v >= 2**31 else str(v)
    return f"({text})" if text.startswith("-") else text


def load(d: DType, element: str) -> str:
    """A stored element, read into its compute type."""
    if d is DType.FLOAT16:
        return f"(float){element}"
    if d is DType.BFLOAT16:
        return f"tf_bf16_to_f32({element})"
    return element


def store(d: DType, value: str) -> str:
    """A compute-type value of ``d``, written as its storage type."""
    if d is DType.FLOAT16:
        return f"(_Float16)({value})"
    if d is DType.BFLOAT16:
        return f"tf_f32_to_bf16({value})"
    if d is DType.BOOL:
        return f"(uint8_t)({value})"
    return value


def round_to(d: DType, value: str) -> str:
    """A float result of arithmetic on a half dtype, rounded to it (ONNX Runtime computes
    half ops in float32 and rounds each result)."""
    if d is DType.FLOAT16:
        return f"tf_round_f16({value})"
    if d is DType.BFLOAT16:
        return f"tf_round_bf16({value})"
    return value


def convert(value: str, src: DType, dst: DType) -> str:
    """A compute-type value of ``src`` as a compute-type value of ``dst`` (ONNX Cast)."""
    if src is dst or (src in HALF_FLOATS and dst is DType.FLOAT32):  # already a float
        return value
    if dst is DType.BOOL:
        return f"({value} != 0)"
    if dst is DType.FLOAT16:
        if src is DType.BFLOAT16 or src is DType.FLOAT32:
            return f"tf_round_f16({value})"
        return f"(float)(_Float16)({value})"  # one rounding, straight from double or int
    if dst is DType.BFLOAT16:
        return f"tf_round_bf16((float)({value}))"
    if dst.is_float:
        return f"({compute(dst)})({value})"
    return f"({compute(dst)})({value})"  # C truncates floats toward zero, wraps ints


def store_as(value: str, src: DType, dst: DType) -> str:
    """A compute-type value of ``src`` written into a ``dst`` element (numpy's astype:
    one rounding straight to the element type)."""
    if dst is DType.FLOAT16 and src in (DType.FLOAT32, DType.FLOAT64):
        return f"(_Float16)({value})"
    if dst is DType.BFLOAT16 and src is DType.FLOAT32:
        return f"tf_f32_to_bf16({value})"
    return store(dst, convert(value, src, dst))
