"""The prelude's product core over tap rows ``tf_tap_gemm_f32`` (c += a @ B with row p of B
at b + off[p]: a convolution's taps, a Winograd point's tiles) against a float64 product,
at every column tail its strips leave (AVX-512: strips of 32, then 16-wide masked ones;
AVX2: strips of 16, one of 8, then an 8-wide masked one), for the host's instruction set
and for x86-64-v3. Columns past n and rows past m are never written; with ``zero`` c is
not read. A tail column's sums are bit for bit a strip's."""
import ctypes

import numpy as np
import pytest

from tests.codegen.prelude_builds import build_prelude, host_levels
from tilefuse.codegen.cpu.prelude import PRELUDE, TAP_PRELUDE

# n: Winograd's tile counts (28: ResNet-50's 56 x 56 blocks of 8 rows) and every tail
SHAPES = [(m, n, k) for m in (1, 5, 7, 13, 64) for n in (1, 3, 8, 12, 15, 16, 17, 24, 28, 31, 33, 40, 49) for k in (1, 9, 64)]


@pytest.fixture(scope="module", params=host_levels("x86-64-v3"))
def core(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"taps-{request.param}")
    entry = ("void taps(long m, long n, long k, const float *a, long lda, const float *b, const int *off, float *c, "
             "long ldc, int zero) { tf_tap_gemm_f32(m, n, k, a, lda, b, off, c, ldc, zero); }\n")
    return build_prelude(tmp, PRELUDE + TAP_PRELUDE + entry, request.param).taps


def _call(core, m, n, k, a, b, off, c, ldc, zero):
    ptr = ctypes.c_void_p
    core(ctypes.c_long(m), ctypes.c_long(n), ctypes.c_long(k), a.ctypes.data_as(ptr), ctypes.c_long(a.shape[1]),
         b.ctypes.data_as(ptr), off.ctypes.data_as(ptr), c.ctypes.data_as(ptr), ctypes.c_long(ldc), ctypes.c_int(zero))


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_the_tap_core_matches_a_float64_product(core, m, n, k, zero):
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    a = rng.standard_normal((m, k + 3)).astype(np.float32)  # rows lie k + 3 apart
    b = rng.standard_normal(4 * k * n + 64).astype(np.float32)
    off = rng.permutation(4 * k)[:k].astype(np.int32) * n  # rows of B anywhere in b, in any order
    ldc = n + 7
    c = rng.standard_normal((m + 1, ldc)).astype(np.float32)  # one more row: never written
    big_b = np.stack([b[o:o + n] for o in off]) if k else np.zeros((0, n), np.float32)
    want = c.astype(np.float64)
    if zero:
        c[:m, :n] = np.nan  # not read
        want[:m, :n] = 0.0
    want[:m, :n] += a[:, :k].astype(np.float64) @ big_b.astype(np.float64)
    _call(core, m, n, k, a, b, off, c, ldc, zero)
    assert np.array_equal(c[:, n:], want[:, n:].astype(np.float32)), "columns past n were written"
    assert np.array_equal(c[m], want[m].astype(np.float32)), "a row past m was written"
    err = np.abs(c[:m, :n] - want[:m, :n]).max(initial=0.0)
    assert err <= 1e-5 * max(1.0, np.abs(want[:m, :n]).max()) * np.sqrt(k), (m, n, k, err)


@pytest.mark.parametrize("m, tail, k", [(13, 4, 9), (7, 12, 64), (64, 8, 9), (5, 1, 64)])
def test_a_column_tail_sums_as_the_strips_do(core, m, tail, k):
    """Columns past the last whole strip come out bit for bit as inside a strip: a
    Winograd point's values do not depend on how many tiles its block has."""
    rng = np.random.default_rng(m * 31 + tail * 7 + k)
    n = 32 + tail
    a = rng.standard_normal((m, k)).astype(np.float32)
    rows = rng.standard_normal((k, n)).astype(np.float32)
    off = (np.arange(k) * n).astype(np.int32)
    as_tail = np.zeros((m, n), np.float32)
    _call(core, m, n, k, a, rows.ravel(), off, as_tail, n, 1)
    shifted = np.ascontiguousarray(rows[:, tail:])  # the same last columns, now the strip's last
    in_strip = np.zeros((m, 32), np.float32)
    _call(core, m, 32, k, a, shifted.ravel(), (np.arange(k) * 32).astype(np.int32), in_strip, 32, 1)
    assert np.array_equal(as_tail[:, tail:], in_strip), (m, tail, k)
