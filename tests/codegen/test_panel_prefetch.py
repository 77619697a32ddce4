"""Without AVX-512 the float panel core's first 6 rows run in stretches of 16 K steps
while they prefetch the next panel block (codegen/cpu/prelude.py, ``tf_panel_rows``);
each stretch is a call of the same core, which adds in the same order, so those rows'
sums are bit for bit what a product of those 6 rows alone gives (which never takes that
path), at every level the host runs. K of 300 in blocks of 128 (blocks of 128, 128 and
44: stretches that do not divide them), three panels (the next block is the next
panel's first), a first product that starts the tile at zero and one that adds to it."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tests.codegen.cpu_programs import param, program
from tests.codegen.prelude_builds import host_levels
from tilefuse.codegen.cpu import build_all, emit_program
from tilefuse.codegen.cpu.call import call_kernel
from tilefuse.codegen.options import CpuOptions
from tilefuse.ir.dtypes import DType
from tilefuse.tile_ir.ir import Buffer, Const, Fill, Load, Loop, LoopKind, PanelGemm, Region, Scope, Store, Var, const_index
from tilefuse.tile_ir.lower.panels import pack

K, N, WIDTH, K_BLOCK = 300, 96, 32, 128


def _product(m: int, name: str, zero: bool):
    """out = c0 + a @ W: the tile filled from ``c0``, then the panel product adds to it;
    ``zero``: out = a @ W, the product starting the tile at zero (the core's ``zero``)."""
    a, b, c0 = param("a", DType.FLOAT32, (m, K)), param("b", DType.FLOAT32, (N // WIDTH, K, WIDTH)), param("c0", DType.FLOAT32, (m, N))
    out = param("out", DType.FLOAT32, (m, N))
    c = Buffer("c_tile", DType.FLOAT32, (m, N), Scope.FRAGMENT)
    i, j = Var("i"), Var("j")
    fill = (Fill(c, Const(0.0, DType.FLOAT32)) if zero
            else Loop(i, m, LoopKind.SERIAL, (Loop(j, N, LoopKind.SERIAL, (Store(c, (i, j), Load(c0, (i, j))),)),)))
    body = [fill,
            PanelGemm(Region(a, (const_index(0), const_index(0)), (m, K)), b, const_index(0), const_index(0), c, K_BLOCK),
            Loop(i, m, LoopKind.SERIAL, (Loop(j, N, LoopKind.SERIAL, (Store(out, (i, j), Load(c, (i, j))),)),))]
    return program(name, [a, b, c0], [out], body, allocs=[c])


@pytest.mark.parametrize("isa", host_levels())
@pytest.mark.parametrize("start", ["zero", "values"])
def test_the_prefetching_rows_sum_as_the_core_does(isa, start):
    rng = np.random.default_rng()
    a = rng.standard_normal((20, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    c0 = np.zeros((20, N), np.float32) if start == "zero" else rng.standard_normal((20, N)).astype(np.float32)
    panels = pack(w, WIDTH, N)
    wide, alone = (_product(rows, f"prefetch_rows_{rows}_{start}", start == "zero") for rows in (20, 6))
    assert re.search(r"tf_panel_gemm_f32\(.*, 1\);" if start == "zero" else r"tf_panel_gemm_f32\(.*, 0\);",
                     emit_program(wide).text)
    got = {}
    for p, rows in ((wide, 20), (alone, 6)):
        (artifact,) = build_all([p], options=CpuOptions(isa=isa))
        out = np.zeros((rows, N), np.float32)
        call_kernel(artifact, [np.ascontiguousarray(a[:rows]), panels, np.ascontiguousarray(c0[:rows]), out])
        got[rows] = out
    np.testing.assert_array_equal(got[20][:6], got[6], err_msg=f"{isa}: the first 6 rows")
    np.testing.assert_allclose(got[20], c0.astype(np.float64) + a.astype(np.float64) @ w, rtol=1e-4, atol=1e-3)
