"""The product core by a weight in row blocks (``tf_gemm_blocks_f32``, ``ROW_BLOCKS_PRELUDE``):
A's tile stored as the core's register blocks of it (``tile_ir/row_blocks.py``), read from
K step ``k0`` on, gives bit for bit what ``tf_gemm_f32`` gives on the same rows as stored,
at every row count (blocks of 12, the last 13..23 rows split), every column tail (AVX-512:
32-wide strips, then a block's rows in vector lanes; AVX2: blocks turned back into rows
256 K steps at a time), K past a block, with and without its ``zero`` flag, for the host's
instruction set and for x86-64-v3. Rows past m and columns past n are never written. And
``row_blocks.pack`` / ``unpack`` are inverse, tile by tile."""
import ctypes

import numpy as np
import pytest

from tests.codegen.prelude_builds import build_prelude, host_levels
from tilefuse.codegen.cpu.prelude import PRELUDE, ROW_BLOCKS_PRELUDE
from tilefuse.tile_ir import row_blocks

SHAPES = [(m, n, k) for m in (1, 5, 12, 13, 20, 23, 24, 25, 128) for n in (1, 4, 17, 31, 32, 49, 196) for k in (1, 7, 64)]
SHAPES += [(m, n, k) for m in (13, 36) for n in (4, 33, 196) for k in (256, 300)] + [(25, 49, 513)]  # K past a block


@pytest.fixture(scope="module", params=host_levels("x86-64-v3"))
def cores(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"blocks-{request.param}")
    entry = ("void rows(long m, long n, long k, const float *a, long lda, const float *b, long ldb, float *c, long ldc, "
             "int zero) { tf_gemm_f32(m, n, k, a, lda, b, ldb, c, ldc, zero); }\n"
             "void blocks(long m, long n, long k, const float *a, long kp, long k0, const float *b, long ldb, float *c, "
             "long ldc, int zero) { tf_gemm_blocks_f32(m, n, k, a, kp, k0, b, ldb, c, ldc, zero); }\n")
    lib = build_prelude(tmp, PRELUDE + ROW_BLOCKS_PRELUDE + entry, request.param)
    return lib.rows, lib.blocks


@pytest.mark.parametrize("zero", [0, 1])
@pytest.mark.parametrize("m, n, k", SHAPES + [(13, 33, 0)])
def test_a_tile_in_row_blocks_sums_as_its_rows_do(cores, m, n, k, zero):
    rows_core, blocks_core = cores
    rng = np.random.default_rng()
    k0 = 3 if k else 0  # the product's K steps start past the tile's first
    kp = k0 + k + 2  # ... and end before its last
    weight = rng.standard_normal((2 * m, kp)).astype(np.float32)  # two tiles; the product reads the second
    packed = row_blocks.pack(weight, m)
    ldb, ldc = n + 5, n + 7
    b = rng.standard_normal((max(k, 1), ldb)).astype(np.float32)
    c0 = rng.standard_normal((m + 1, ldc)).astype(np.float32)  # one more row: never written
    if zero:
        c0[:m, :n] = np.nan  # not read
    want, got = c0.copy(), c0.copy()
    ptr, long = ctypes.c_void_p, ctypes.c_long
    a_rows = np.ascontiguousarray(weight[m:])
    rows_core(long(m), long(n), long(k), ctypes.c_void_p(a_rows.ctypes.data + 4 * k0), long(kp), b.ctypes.data_as(ptr),
              long(ldb), want.ctypes.data_as(ptr), long(ldc), ctypes.c_int(zero))
    blocks_core(long(m), long(n), long(k), ctypes.c_void_p(packed.ctypes.data + 4 * m * kp), long(kp), long(k0),
                b.ctypes.data_as(ptr), long(ldb), got.ctypes.data_as(ptr), long(ldc), ctypes.c_int(zero))
    assert not np.isnan(got[:m, :n]).any(), "c was read under the zero flag"
    assert np.array_equal(got, want), (m, n, k, np.abs(got - want).max())
    if k:  # (and both the product, not a copy of c)
        exact = a_rows[:, k0:k0 + k].astype(np.float64) @ b[:k, :n].astype(np.float64)
        base = 0.0 if zero else c0[:m, :n].astype(np.float64)
        assert np.abs(got[:m, :n] - (base + exact)).max() <= 1e-5 * max(1.0, np.abs(exact).max()) * np.sqrt(k)


@pytest.mark.parametrize("m, tile", [(12, 12), (26, 13), (256, 128), (40, 20), (7, 7)])
def test_row_blocks_pack_and_unpack_tile_by_tile(m, tile):
    rng = np.random.default_rng()
    rows = rng.standard_normal((m, 9)).astype(np.float32)
    packed = row_blocks.pack(rows, tile)
    assert packed.shape == rows.shape and not np.array_equal(packed, rows)  # (another order)
    assert np.array_equal(row_blocks.unpack(packed, tile), rows)
    flat = packed.reshape(-1)
    for t0 in range(0, m, tile):  # a block of r rows starting at row i of its tile: [K][r] at i * K
        for i, r in row_blocks.blocks(tile):
            start = (t0 + i) * 9
            assert np.array_equal(flat[start:start + 9 * r].reshape(9, r), rows[t0 + i:t0 + i + r].T)


def test_the_core_blocks_rows_by_its_rule():
    assert row_blocks.blocks(12) == [(0, 12)]
    assert row_blocks.blocks(20) == [(0, 10), (10, 10)]
    assert row_blocks.blocks(23) == [(0, 12), (12, 11)]
    assert row_blocks.blocks(24) == [(0, 12), (12, 12)]
    assert row_blocks.blocks(128) == [(i, 12) for i in range(0, 108, 12)] + [(108, 10), (118, 10)]
    with pytest.raises(ValueError, match="do not fit"):
        row_blocks.pack(np.zeros((10, 3), np.float32), 4)
