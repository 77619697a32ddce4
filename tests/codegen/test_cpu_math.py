"""The prelude's vectorisable float32 exp, tanh, sigmoid and erf against float64 numpy: within
3 ulp of the correctly rounded result everywhere, and IEEE special values exactly as libm
gives them (NaN, +-inf, -0, overflow to inf, underflow through subnormals to 0)."""
import ctypes
import math
import subprocess

import numpy as np
import pytest

from tilefuse.codegen.cpu.build import find_compiler, flags
from tilefuse.codegen.cpu.prelude import PRELUDE

FUNCS = {
    "tf_exp_f32": np.exp,
    "tf_tanh_f32": np.tanh,
    "tf_sigmoid_f32": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tf_erf_f32": np.vectorize(math.erf, otypes=[np.float64]),
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("math")
    loops = "".join(
        f"void v_{f}(const float *restrict x, float *restrict y, long n) {{ for (long i = 0; i < n; ++i) y[i] = {f}(x[i]); }}\n"
        for f in FUNCS)
    (tmp / "m.c").write_text(PRELUDE + loops)
    subprocess.run([*find_compiler().command, *flags("native"), "-o", str(tmp / "m.so"), str(tmp / "m.c"), "-lm"], check=True)
    return ctypes.CDLL(str(tmp / "m.so"))


def _inputs(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 88.7228, 88.72284, 88.7229, 89.5, -87.33, -100.0, -103.9, -103.98,
               -104.5, 0.625, -0.625, 0.62500006, 1e-30, -1e-40, 9.0, 20.0, -30.0]
    return np.concatenate([rng.uniform(-110, 95, 200_000), rng.uniform(-2, 2, 100_000),
                           rng.standard_normal(50_000) * 1e-3, special]).astype(np.float32)


@pytest.mark.parametrize("name", list(FUNCS))
def test_within_3_ulp_and_specials_exact(lib, name):
    x = _inputs(seed=hash(name) % 1000)
    got = np.empty_like(x)
    getattr(lib, f"v_{name}")(x.ctypes.data_as(ctypes.c_void_p), got.ctypes.data_as(ctypes.c_void_p), ctypes.c_long(x.size))
    with np.errstate(all="ignore"):
        want64 = FUNCS[name](x.astype(np.float64))
    want = want64.astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isfinite(want)], want[~np.isfinite(want)], equal_nan=True)
    assert np.array_equal(np.signbit(got[got == 0]), np.signbit(want[got == 0]))
    fin = np.isfinite(want)
    ulp = np.abs(got[fin].astype(np.float64) - want64[fin]) / np.spacing(np.maximum(np.abs(want[fin]), np.float32(2**-126)))
    assert ulp.max() <= 3.0, f"{name}: {ulp.max():.2f} ulp at x={x[fin][ulp.argmax()]!r}"
