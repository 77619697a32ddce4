"""Fit the CPU prelude's float32 erf (tilefuse/codegen/cpu/prelude.py, ``tf_erf_f32``).

    python tools/fit_erf.py          # prints the coefficients and their errors (needs mpmath)

Two pieces, each a polynomial of degree 6 fitted by Lawson's iteratively reweighted least
squares (which tends to the minimax fit) against erf in 30-digit arithmetic:

- |x| < 1: erf(x) = x S(x^2), S fitted to erf(x)/x on [0, 1] for the least relative error;
- 1 <= |x| <= 3.92: erf(x) = 1 - exp(G(|x|) - x^2), G fitted to log erfc(x) + x^2 in
  powers of |x| - 2.46, weighted by erfc(x) in ulps of erf near 1 (what an error in G costs
  the result). Beyond 3.92, erf rounds to +-1 in float32; the prelude clamps |x| there.

The float32 coefficients printed are what the prelude holds; tests/codegen/test_cpu_math.py
checks the compiled function within 3 ulp of the correctly rounded erf.
"""
from __future__ import annotations

import mpmath
import numpy as np

SPLIT, CLAMP, CENTRE, DEGREE = 1.0, 3.92, 2.46, 6
ULP_NEAR_ONE = 2.0 ** -24  # the spacing of float32 in [0.5, 1)


def lawson(basis: np.ndarray, target: np.ndarray, scale: np.ndarray, iterations: int = 300):
    """Coefficients minimising max |scale * (basis @ c - target)|, and that maximum."""
    weights = np.full(len(target), 1.0 / len(target))
    best = (np.inf, None)
    for _ in range(iterations):
        root = np.sqrt(weights) * scale
        coef, *_ = np.linalg.lstsq(basis * root[:, None], target * root, rcond=None)
        err = (basis @ coef - target) * scale
        if np.abs(err).max() < best[0]:
            best = (float(np.abs(err).max()), coef)
        weights = weights * np.abs(err) + 1e-300
        weights /= weights.sum()
    return best[1], best[0]


def main() -> None:
    mpmath.mp.dps = 30
    x = np.linspace(0.0, SPLIT, 3000)
    ratio = np.array([float(mpmath.erf(v) / v) if v else float(2 / mpmath.sqrt(mpmath.pi)) for v in x])
    s, s_err = lawson(np.vander(x * x, DEGREE + 1, increasing=True), ratio, 1.0 / ratio)
    x = np.linspace(SPLIT, CLAMP, 3000)
    g_target = np.array([float(mpmath.log(mpmath.erfc(v)) + v * v) for v in x])
    erfc = np.array([float(mpmath.erfc(v)) for v in x])
    g, g_err = lawson(np.vander(x - CENTRE, DEGREE + 1, increasing=True), g_target, erfc / ULP_NEAR_ONE)
    print(f"S (x^2 powers, 0..{DEGREE}): relative error {s_err:.3g}")
    print("   ", [float(c) for c in s.astype(np.float32)])
    print(f"G ((|x| - {CENTRE}) powers, 0..{DEGREE}): {g_err:.3g} ulp of erf near 1")
    print("   ", [float(c) for c in g.astype(np.float32)])


if __name__ == "__main__":
    main()
