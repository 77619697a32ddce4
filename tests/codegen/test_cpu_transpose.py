"""The prelude's block transpose ``tf_transpose_f32`` (d[j * ds + i] = s[i * ss + j]) at
every edge its blocks leave (AVX-512: 16 x 16 blocks, masked at the edges; AVX2: whole
8 x 8 blocks, the last rows and columns element by element; else element by element),
with leading dimensions past the block, for the host's instruction set and each portable
level it runs. Nothing outside the rows x cols block of d is written."""
import ctypes

import numpy as np
import pytest

from tests.codegen.prelude_builds import build_prelude, host_levels
from tilefuse.codegen.cpu.prelude import PRELUDE, TRANSPOSE_PRELUDE

SHAPES = [(r, c) for r in (1, 7, 8, 9, 16, 17, 49) for c in (1, 5, 8, 15, 16, 24, 33, 196)]


@pytest.fixture(scope="module", params=host_levels())
def transpose(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"transpose-{request.param}")
    entry = ("void t(const float *s, long ss, float *d, long ds, long rows, long cols) "
             "{ tf_transpose_f32(s, ss, d, ds, rows, cols); }\n")
    return build_prelude(tmp, PRELUDE + TRANSPOSE_PRELUDE + entry, request.param).t


@pytest.mark.parametrize("rows, cols", SHAPES)
def test_a_block_is_turned_over(transpose, rows, cols):
    rng = np.random.default_rng(rows * 1009 + cols)
    ss, ds = cols + 3, rows + 5
    s = rng.standard_normal((rows, ss)).astype(np.float32)
    d = rng.standard_normal((cols + 1, ds)).astype(np.float32)  # one more row: never written
    want = d.copy()
    want[:cols, :rows] = s[:, :cols].T
    ptr = ctypes.c_void_p
    transpose(s.ctypes.data_as(ptr), ctypes.c_long(ss), d.ctypes.data_as(ptr), ctypes.c_long(ds),
              ctypes.c_long(rows), ctypes.c_long(cols))
    np.testing.assert_array_equal(d, want, err_msg=f"{rows} x {cols}")
