// tilefuse's device functions, included ahead of every CUDA kernel (nvcc -include) and
// called from emitted kernels by name (T.call_extern). Plain C++ with CUDA intrinsics:
// every argument is evaluated once, which TileLang's inlined lets do not guarantee.
// Also compiled for the host (tests/codegen/test_cuda_fast_math.py), where the intrinsics
// fall back to their exact counterparts.
#pragma once

#ifdef __CUDA_ARCH__
#define TF_RCP(x) __fdividef(1.0f, (x))  // rcp.approx and a product: within 2 ulp
#define TF_EXP(x) __expf(x)              // ex2.approx of x log2(e): within 2 ulp + |x| 2^-22
#else
#include <cmath>
#define TF_RCP(x) (1.0f / (x))
#define TF_EXP(x) std::exp(x)
#endif

// 1 + erf(u), the exact GELU's x/2 (1 + erf(x / sqrt 2)): 1 + sign(u) (1 - erfc(|u|)), erfc
// from Abramowitz and Stegun 7.1.26 (t P(t) exp(-u^2), t = 1 / (1 + p |u|)), absolute error
// <= 1.5e-7 on erf; ~15 instructions where erff takes ~26 (two selected polynomials and an
// exponential). NaN stays NaN; +-inf give 2 and 0.
static __host__ __device__ __forceinline__ float tf_erf_plus_one(float u) {
  const float a = fabsf(u);
  const float t = TF_RCP(fmaf(0.3275911f, a, 1.0f));
  const float p = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, 1.061405429f, -1.453152027f), 1.421413741f), -0.284496736f),
                           0.254829592f);
  const float erfc = p * TF_EXP(-a * a);
  return 1.0f + copysignf(1.0f - erfc, u);
}
