"""The prelude's register-blocked product core ``tf_gemm_f32`` (c += a @ b on float32 tiles
with leading dimensions) against a float64 product, at every column tail a strip leaves
(AVX-512: strips of 32, then 16-wide ones, the last masked, or, where 8 columns or fewer
are left, 16 rows in vector lanes, a turned block of 256 k at a time; AVX2: strips of 16, 8
and a zero-padded copy), odd row counts and leading dimensions past the tile, for the host's
instruction set and for x86-64-v3. Columns past n and rows past m are never written. With
its ``zero`` flag it computes c = a @ b without reading c (codegen/cpu/first_products.py),
also with no K at all (c zeroed). A tail column's sums are bit for bit a strip's."""
import ctypes

import numpy as np
import pytest

from tests.codegen.prelude_builds import build_prelude, host_levels
from tilefuse.codegen.cpu.prelude import PRELUDE

SHAPES = [(m, n, k) for m in (1, 5, 12, 13, 25) for n in (1, 4, 15, 16, 17, 31, 32, 33, 49, 63, 64, 70, 196) for k in (1, 7, 64)]
SHAPES += [(m, n, k) for m in (5, 13) for n in (4, 8, 33, 196) for k in (300, 256)] + [(25, 49, 513)]  # K past a block


@pytest.fixture(scope="module", params=host_levels("x86-64-v3"))
def core(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"core-{request.param}")
    entry = ("void gemm(long m, long n, long k, const float *a, long lda, const float *b, long ldb, float *c, long ldc, "
             "int zero) { tf_gemm_f32(m, n, k, a, lda, b, ldb, c, ldc, zero); }\n")
    return build_prelude(tmp, PRELUDE + entry, request.param).gemm


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("m, n, k", SHAPES + [(5, 33, 0)])
def test_the_product_core_matches_a_float64_product(core, m, n, k, zero):
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    lda, ldb, ldc = k + 3, n + 5, n + 7  # rows of each operand lie apart, past the tile
    a = rng.standard_normal((m, lda)).astype(np.float32)
    b = rng.standard_normal((k, ldb)).astype(np.float32)
    c = rng.standard_normal((m + 1, ldc)).astype(np.float32)  # one more row: never written
    want = c.astype(np.float64)
    if zero:  # c's values are not read: NaN where the product lands
        c[:m, :n] = np.nan
        want[:m, :n] = 0.0
    want[:m, :n] += a[:, :k].astype(np.float64) @ b[:, :n].astype(np.float64)
    ptr = ctypes.c_void_p
    core(ctypes.c_long(m), ctypes.c_long(n), ctypes.c_long(k), a.ctypes.data_as(ptr), ctypes.c_long(lda),
         b.ctypes.data_as(ptr), ctypes.c_long(ldb), c.ctypes.data_as(ptr), ctypes.c_long(ldc), ctypes.c_int(zero))
    assert np.array_equal(c[:, n:], want[:, n:].astype(np.float32)), "columns past n were written"
    assert np.array_equal(c[m], want[m].astype(np.float32)), "a row past m was written"
    err = np.abs(c[:m, :n] - want[:m, :n]).max(initial=0.0)
    assert err <= 1e-5 * max(1.0, np.abs(want[:m, :n]).max()) * np.sqrt(k), (m, n, k, err)


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("m, tail, k", [(13, 4, 7), (25, 8, 300), (5, 1, 64), (17, 5, 513)])
def test_a_column_tail_sums_as_the_strips_do(core, m, tail, k, zero):
    """Columns past the last whole strip come out bit for bit as they do inside a strip
    (every element summed over k in order, one fused multiply-add a step): a product's
    values do not depend on where its column tiles cut it."""
    rng = np.random.default_rng(m * 31 + tail * 7 + k)
    n = 32 + tail
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    as_tail, in_strip = c0.copy(), np.ascontiguousarray(c0[:, tail:])
    ptr = ctypes.c_void_p
    core(ctypes.c_long(m), ctypes.c_long(n), ctypes.c_long(k), a.ctypes.data_as(ptr), ctypes.c_long(k),
         b.ctypes.data_as(ptr), ctypes.c_long(n), as_tail.ctypes.data_as(ptr), ctypes.c_long(n), ctypes.c_int(zero))
    shifted = np.ascontiguousarray(b[:, tail:])  # the same last columns, now the strip's last
    core(ctypes.c_long(m), ctypes.c_long(32), ctypes.c_long(k), a.ctypes.data_as(ptr), ctypes.c_long(k),
         shifted.ctypes.data_as(ptr), ctypes.c_long(32), in_strip.ctypes.data_as(ptr), ctypes.c_long(32), ctypes.c_int(zero))
    np.testing.assert_array_equal(as_tail[:, 32:], in_strip[:, 32 - tail:])
