"""Comparing tilefuse's outputs with a reference, with tolerances stated per dtype and per
the precision a plan computed in."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Max abs error allowed, relative to the reference output's scale (max |x|, at least 1).
TOLERANCE = {"float64": 1e-7, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
# The same for the arithmetic a plan computed in (``compile(precision=...)``), which may be
# coarser than its outputs' dtype: a float32 model compiled with fp16 or bf16 returns
# float32 outputs holding half-precision results. tf32 products round their operands to a
# 10-bit mantissa and accumulate in float32 (issue 5: within 1e-3 of the scale).
PRECISION_TOLERANCE = {"fp32": 0.0, "tf32": 1e-3, "fp16": TOLERANCE["float16"], "bf16": TOLERANCE["bfloat16"],
                       "int8": 3e-2}
# "int8": a model that quantizes its activations (QuantizeLinear on computed values) rounds
# them to 8-bit steps, so two correct executions disagree wherever the float before a
# quantization lands on a tie by an ulp of summation order: that element moves one step
# (about 2/255 of its range) and what is computed from it moves by a few. Tiny bert-qdq
# against onnxruntime, 300 seeds: at most 1.7e-2 of the scale, on at most 3% of elements.
# Its quantized (8-bit integer) values themselves may differ by one step. A model with
# quantized weights only is as far from onnxruntime, which quantizes the activations
# such weights multiply (MatMulNBits, from its extended graph optimizations).


def default_tolerance(dtype: str, precision: str = "fp32") -> float:
    """The tolerance of a ``dtype`` output of a plan computing in ``precision``: the looser
    of the two. Integer and bool outputs are compared exactly whatever the precision."""
    if dtype not in TOLERANCE:
        return 0.0
    return max(TOLERANCE[dtype], PRECISION_TOLERANCE.get(precision, 0.0))


@dataclass(frozen=True)
class Comparison:
    name: str
    dtype: str
    max_abs_error: float
    scale: float
    tolerance: float
    problem: str = ""  # dtype/shape mismatch, or values beyond tolerance
    rtol: float | None = None  # set when the check was elementwise: |got - want| <= atol + rtol |want|
    atol: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def relative_error(self) -> float:
        return self.max_abs_error / self.scale

    def describe(self) -> str:
        """One line: the error, the bound it was held to, the verdict."""
        if self.rtol is not None or self.atol is not None:
            bound = f"atol {self.atol or 0:g}, rtol {self.rtol or 0:g}"
        else:
            bound = f"scale {self.scale:.3g}, tolerance {self.tolerance:g} x scale"
        verdict = "ok" if self.ok else f"FAIL: {self.problem}"
        return f"max abs error {self.max_abs_error:.3g} ({bound}) {verdict}"


def compare_output(name: str, got: np.ndarray, want: np.ndarray, tolerance: float | None = None, *,
                   precision: str = "fp32", rtol: float | None = None, atol: float | None = None) -> Comparison:
    """``got`` against ``want``: max abs error within ``tolerance`` (default:
    ``default_tolerance`` of the dtype and the ``precision`` computed in) times the
    reference's scale. With ``rtol`` or ``atol`` (the other then 0), every element instead:
    ``|got - want| <= atol + rtol * |want|``, numpy's ``allclose`` rule. NaNs must sit where
    the reference has them. At ``precision`` "int8" (a quantized model's,
    ``frontend.qdq.checked_precision``), 8-bit integer outputs may be one step off."""
    dtype = str(want.dtype)
    tol = default_tolerance(dtype, precision) if tolerance is None else tolerance
    one_step = precision == "int8" and tolerance is None and dtype in ("int8", "uint8")
    elementwise = rtol is not None or atol is not None
    if got.dtype != want.dtype:
        return Comparison(name, dtype, float("inf"), 1.0, tol, f"dtype {got.dtype}, expected {want.dtype}", rtol, atol)
    if got.shape != want.shape:
        return Comparison(name, dtype, float("inf"), 1.0, tol, f"shape {got.shape}, expected {want.shape}", rtol, atol)
    g, w = got.astype(np.float64), want.astype(np.float64)
    if g.size == 0:
        return Comparison(name, dtype, 0.0, 1.0, tol, "", rtol, atol)
    same_nan = np.isnan(g) == np.isnan(w)
    finite = ~np.isnan(w)
    with np.errstate(invalid="ignore"):
        diff = np.where(g == w, 0.0, np.abs(g - w))  # equal infinities: no error
    err = float(np.max(diff[finite], initial=0.0))
    scale = max(1.0, float(np.max(np.abs(w[finite & np.isfinite(w)]), initial=0.0)))
    bound = 1.0 if one_step else tol * scale  # a quantized value: one step either way
    if one_step:
        tol = bound / scale
    problem = ""
    if not same_nan.all():
        problem = f"NaN in {int((~same_nan).sum())} places where the reference has none (or the reverse)"
    elif elementwise:
        limit = (atol or 0.0) + (rtol or 0.0) * np.abs(w)
        beyond = finite & ~(diff <= limit)
        if beyond.any():
            problem = f"{int(beyond.sum())} of {w.size} elements beyond atol + rtol x |reference|"
    elif err > bound or np.isnan(err):
        problem = f"max abs error {err:.3g} exceeds {tol:g} x scale {scale:.3g}"
    return Comparison(name, dtype, err, scale, tol, problem, rtol, atol)
