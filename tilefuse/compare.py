"""Comparing tilefuse's outputs with a reference, with tolerances stated per dtype."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Max abs error allowed, relative to the reference output's scale (max |x|, at least 1).
TOLERANCE = {"float64": 1e-7, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass(frozen=True)
class Comparison:
    name: str
    dtype: str
    max_abs_error: float
    scale: float
    tolerance: float
    problem: str = ""  # dtype/shape mismatch, or values beyond tolerance

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def relative_error(self) -> float:
        return self.max_abs_error / self.scale


def compare_output(name: str, got: np.ndarray, want: np.ndarray, tolerance: float | None = None) -> Comparison:
    """``got`` against ``want``: max abs error within ``tolerance`` (default: TOLERANCE for
    the dtype) times the reference's scale."""
    dtype = str(want.dtype)
    tol = TOLERANCE.get(dtype, 0.0) if tolerance is None else tolerance
    if got.dtype != want.dtype:
        return Comparison(name, dtype, float("inf"), 1.0, tol, f"dtype {got.dtype}, expected {want.dtype}")
    if got.shape != want.shape:
        return Comparison(name, dtype, float("inf"), 1.0, tol, f"shape {got.shape}, expected {want.shape}")
    g, w = got.astype(np.float64), want.astype(np.float64)
    if g.size == 0:
        return Comparison(name, dtype, 0.0, 1.0, tol)
    same_nan = np.isnan(g) == np.isnan(w)
    finite = ~np.isnan(w)
    err = float(np.max(np.abs(g - w)[finite], initial=0.0))
    scale = max(1.0, float(np.max(np.abs(w[finite & np.isfinite(w)]), initial=0.0)))
    problem = ""
    if not same_nan.all():
        problem = f"NaN in {int((~same_nan).sum())} places where the reference has none (or the reverse)"
    elif err > tol * scale or np.isnan(err):
        problem = f"max abs error {err:.3g} exceeds {tol:g} x scale {scale:.3g}"
    return Comparison(name, dtype, err, scale, tol, problem)
